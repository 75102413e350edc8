"""Appending to a packed dataset: new samples as new parts, version N + 1 of its manifest.

How (one mechanism for every source and format):
1. The new source is scanned (any source command's ``SourceScan``); its class names are mapped
   onto the dataset's (existing ones keep their index, new ones are added at the end).
2. It is packed by the ordinary engine (packer/engine/pack_run.py, so ``--engine ray``, ``--resume``,
   fields and the pack-time shuffle all apply) into ``DS/.imgpack-append`` with the dataset's
   recorded preprocessing options, its writer shifted to the dataset's next sample index and part
   number (``FormatWriter.index_base`` / ``part_base``): the new files carry their final names and
   stored indices.
3. The new files are moved into the dataset (no existing file is touched), per-sample sidecars
   (``extra`` entries like ``labels``) are written under versioned names holding old + new
   samples, and the merged manifest, with ``version`` and ``history``, is written last,
   atomically. A reader holding version N's manifest keeps reading exactly version N.

An append killed at any point finishes with ``resume=True``: step 2 resumes like any pack, step 3
moves what is left and writes the same manifest.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.dedup.deduper import Known
from packer.edit._append_place import LocalPlace, Place, RemotePlace
from packer.engine.pack_run import PackReport, pack
from packer.output.output_dir import OutputLock, versioned
from packer.sources.source import SourceScan
from packer.spec import PackSpec
from packer.transform.sizes import KEY as SIZES_KEY
from packer.transform.sizes import merge_sizes
from readers.errors import ImgpackError, OptionError
from readers.formats.packed_sample import PreprocessSpec
from readers.remote.urls import is_url
from readers.store.checksums import sha256_of_bytes
from readers.store.manifest import (
    MANIFEST_NAME,
    PROGRESS_NAME,
    Manifest,
    read_manifest,
)
from readers.store.sample_sources import SOURCE_PATHS_NAME

# Manifest ``extra`` entries naming a per-sample sidecar ({file, bytes, sha256, ...}; fixed-width
# records in dataset order): appended as old bytes + new bytes under a versioned file name.
# Every such entry is found by its shape (see sidecar_keys), so a new sidecar needs no change here.
SIDECAR_FIELDS = ("file", "bytes", "sha256")


@dataclass
class AppendReport:
    dataset: str
    version: int
    added: int
    skipped: int
    num_samples: int
    new_classes: list[str]
    seconds: float
    pack: PackReport | None  # None: the new samples were packed by an interrupted run


def version_of(manifest: Manifest) -> int:
    """The dataset version of ``manifest``: 1 for a dataset never appended to."""
    return int(manifest.extra.get("version", 1))


def describe_versions(manifest: Manifest) -> list[str]:
    """``pack info`` lines: the dataset version and what each version added (none before an append)."""
    if "history" not in manifest.extra:
        return []
    steps = [f"v{h['version']} +{h['added']} from {h['source']} ({h['time']})" for h in history_of(manifest)]
    return [f"version   {version_of(manifest)}: " + steps[0], *(f"          {s}" for s in steps[1:])]


def history_of(manifest: Manifest) -> list[dict[str, Any]]:
    """What each version added (version 1 described from the manifest of a plain pack)."""
    if "history" in manifest.extra:
        return list(manifest.extra["history"])
    first = {"version": 1, "first": 0, "added": manifest.num_samples, "skipped": len(manifest.skipped),
             "source": manifest.extra.get("source", ""), "time": manifest.created}  # fmt: skip
    return [first]


def check_spec(
    manifest: Manifest, spec: PreprocessSpec | dict[str, Any] | None, where: str
) -> PreprocessSpec:
    """The dataset's recorded preprocessing; an asked option (every field of a spec, the keys of
    a dict: the options a user typed) that differs is refused, named, before anything is written."""
    recorded = PreprocessSpec.from_dict(manifest.preprocess)
    asked = dataclasses.asdict(spec) if isinstance(spec, PreprocessSpec) else dict(spec or {})
    for name, value in asked.items():
        if name in manifest.preprocess and manifest.preprocess[name] != value:
            flag = "--" + name.replace("_", "-")
            was = manifest.preprocess[name]
            raise OptionError(
                f"{where}: was packed with {flag} {was}, not {value}; an append uses the dataset's "
                f"options: drop {flag} or pass {was}"
            )
    return recorded


def relabelled(scan: SourceScan, manifest: Manifest, where: str) -> SourceScan:
    """``scan`` with the dataset's class indices: existing names keep theirs, new ones follow."""
    if scan.fields != manifest.fields:
        raise ImgpackError(
            f"{where}: the dataset stores the fields {manifest.fields or 'none'}, the new source has "
            f"{scan.fields or 'none'}; append a source with the same fields"
        )
    classes = list(manifest.classes) + [c for c in scan.classes if c not in manifest.classes]
    index = {name: i for i, name in enumerate(classes)}
    mapping = [index[name] for name in scan.classes]
    if mapping == list(range(len(mapping))) and classes == scan.classes:
        return scan
    items = [dataclasses.replace(item, label=mapping[item.label]) for item in scan.items]
    return dataclasses.replace(scan, classes=classes, items=items)


def append_to(
    dataset: str | os.PathLike,
    scan: SourceScan,
    spec: PreprocessSpec | dict[str, Any] | None = None,
    **options: Any,
) -> AppendReport:
    """Append the scanned source ``scan`` to the dataset at ``dataset`` (version N -> N + 1): a
    folder or a URL (``s3://...``, opened with ``storage_options``). ``spec``: preprocessing
    options that must match the dataset's; ``options``: ``packer.spec.PackSpec``'s keywords for
    the rest (``workers``, ``engine``, ``options``, ``resume``, ``dedup``, ...). ``dedup``
    (packer/dedup/deduper.py) skips new samples that repeat one of the dataset's or an earlier new one."""
    storage_options = options.get("storage_options")
    manifest = read_manifest(dataset, storage_options)
    asked = PackSpec(source=scan, out=dataset, format=manifest.format, **options)
    return append_with(asked, spec, manifest)


def append_with(
    asked: PackSpec, spec: PreprocessSpec | dict[str, Any] | None, manifest: Manifest | None = None
) -> AppendReport:
    """Append ``asked.source`` (scanned) to the dataset ``asked.out`` as ``asked`` says (its
    preprocessing, order and format are the dataset's; ``spec``: options asked to match them)."""
    started = time.perf_counter()
    dataset, storage_options, scan = asked.out, asked.storage_options, asked.source
    if not isinstance(scan, SourceScan):
        raise OptionError(f"{dataset}: an append takes a scanned source (packer.sources.source.SourceScan)")
    place: Place = RemotePlace(dataset, storage_options) if is_url(dataset) else LocalPlace(Path(dataset))
    manifest = manifest or read_manifest(dataset, storage_options)
    if asked.format != manifest.format:
        raise OptionError(f"{dataset}: is a {manifest.format} dataset, not --to {asked.format}; drop --to")
    recorded = check_spec(manifest, spec, place.name)
    scan = relabelled(scan, manifest, place.name)
    staging = place.staging
    if staging.exists() and not asked.resume:
        raise ImgpackError(f"{place.name}: an interrupted append is there ({staging}); re-run with --resume")
    options = dict(asked.options)
    compression = manifest.extra.get("hdf5", {}).get("compression")
    if compression and manifest.format == "hdf5":
        options.setdefault("compression", compression)
    order = manifest.extra.get("order", {"kind": "shuffled", "seed": 0})  # --order source: seed None
    staged = dataclasses.replace(asked, source=scan, out=staging, preprocess=recorded, options=options,
                                 order=order["kind"], seed=int(order.get("seed") or 0),
                                 resume=asked.resume and staging.exists())  # fmt: skip
    # One append at a time: locally the dataset folder is locked; remotely, the staging pack's own lock.
    lock = OutputLock(place.root) if isinstance(place, LocalPlace) else None
    known = Known.of(str(dataset), storage_options) if asked.dedup else None  # against the dataset too
    try:
        report = None
        if not (staging / MANIFEST_NAME).exists():
            report = pack(staged, base=(Path(str(dataset)), manifest), known=known)
        added = read_manifest(staging)
        if _committed(manifest, added):  # killed after its manifest was written: only tidy up
            merged = manifest
        else:
            merged = merged_manifest(place, manifest, added)
            _graft(staging, place, added)
            place.write_manifest(merged)
        shutil.rmtree(staging)
    finally:
        if lock is not None:
            lock.release()
    new_classes = merged.extra["history"][-1]["new_classes"]
    seconds = time.perf_counter() - started
    return AppendReport(place.name, version_of(merged), added.num_samples, len(added.skipped),
                        merged.num_samples, new_classes, seconds, report)  # fmt: skip


def _committed(manifest: Manifest, added: Manifest) -> bool:
    """Whether ``manifest`` is already the version that ``added`` (a staged append) made."""
    history = manifest.extra.get("history") or [{}]
    return bool(added.shards) and history[-1].get("shards") == [s.file for s in added.shards]


def sidecar_keys(extra: dict[str, Any]) -> list[str]:
    """The ``extra`` keys naming a per-sample sidecar file (an entry with file, bytes, sha256)."""
    return sorted(k for k, v in extra.items() if isinstance(v, dict) and all(f in v for f in SIDECAR_FIELDS))


def merged_manifest(place: Place, old: Manifest, new: Manifest) -> Manifest:
    """Version N + 1: old shards then new ones, sidecars extended (their files written here)."""
    version = version_of(old) + 1
    extra = dict(old.extra)
    for key in sidecar_keys(old.extra):
        if key not in new.extra:
            raise ImgpackError(f"{place.name}: the new samples have no {key} sidecar; re-run with --resume")
        entry = dict(old.extra[key])
        name = versioned(entry["file"], version)
        data = place.read(entry["file"]) + (place.staging / new.extra[key]["file"]).read_bytes()
        if place.size(name) != len(data):
            place.write(name, data)
        extra[key] = {**entry, "file": name, "bytes": len(data), "sha256": sha256_of_bytes(data)}
    fmt_key = old.format
    if isinstance(old.extra.get(fmt_key), dict) and isinstance(new.extra.get(fmt_key), dict):
        extra[fmt_key] = _merged_entry(old.extra[fmt_key], new.extra[fmt_key])
    empty = set(old.extra.get("empty_classes", [])) & set(new.extra.get("empty_classes", []))
    extra["empty_classes"] = sorted(empty)
    step = {"version": version, "first": old.num_samples, "added": new.num_samples,
            "skipped": len(new.skipped), "source": new.extra.get("source", ""), "time": new.created,
            "shards": [s.file for s in new.shards],
            "new_classes": new.classes[len(old.classes) :]}  # fmt: skip
    extra["version"] = version
    extra["history"] = [*history_of(old), step]
    new_paths = place.staging / SOURCE_PATHS_NAME
    if place.size(SOURCE_PATHS_NAME) is not None and new_paths.exists():
        paths = place.read(SOURCE_PATHS_NAME)
        if paths.count(b"\0") != old.num_samples + new.num_samples:  # not yet extended (a resumed graft)
            place.write(SOURCE_PATHS_NAME, paths + new_paths.read_bytes())
    counts = dict(old.field_counts)
    for name, n in new.field_counts.items():
        counts[name] = counts.get(name, 0) + n
    sizes = merge_sizes([{SIZES_KEY: old.stored_sizes}, {SIZES_KEY: new.stored_sizes}])
    return dataclasses.replace(
        old,
        num_samples=old.num_samples + new.num_samples,
        classes=new.classes,
        shards=[*old.shards, *(dataclasses.replace(s, first=s.first + old.num_samples) for s in new.shards)],
        skipped=[*old.skipped, *new.skipped],
        extra=extra,
        stored_sizes=sizes,
        field_counts=counts,
        created=new.created,
    )


def _merged_entry(old: Any, new: Any) -> Any:
    """A format's own ``extra`` entry for old + new parts: lists joined, dicts merged."""
    if isinstance(old, list) and isinstance(new, list):
        return [*old, *new]
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: _merged_entry(old[k], new[k]) if k in old and k in new else new.get(k, old.get(k))
                for k in {**old, **new}}  # fmt: skip
    return old


def _graft(staging: Path, place: Place, added: Manifest) -> None:
    """Move the new data files from ``staging`` into the dataset (folders merged); never replace."""
    own = {MANIFEST_NAME, PROGRESS_NAME, SOURCE_PATHS_NAME}
    own |= {added.extra[k]["file"] for k in sidecar_keys(added.extra)}
    for entry in sorted(os.listdir(staging)):
        if entry not in own and not entry.startswith("."):
            place.move_in(staging / entry, entry)
