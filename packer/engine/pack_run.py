"""Running a pack: scan, cut into parts, preprocess in parallel, write in order, manifest last.

What to pack is a ``PackSpec`` (packer/spec.py), checked when it is made; ``pack_folder`` builds
one from its keywords. Engines:
- ``local`` (default, packer/engine/_local_engine.py): a process pool (packer/engine/_pool.py) preprocesses
  samples (a bounded window of small chunks in flight, so memory does not grow with the dataset);
  the main process writes them strictly in source order, so the output is byte-identical for any
  number of workers.
- ``ray`` (packer/engine/_ray_engine.py): one Ray task per part, each preprocessing and writing its own
  part files on storage all nodes share; the driver merges their results into the manifest.

Progress is recorded per finished part in ``.imgpack-progress.json`` (packer/output/progress.py);
``resume=True`` redoes only the parts that did not finish. The manifest is written last, atomically.

Source and output may be fsspec URLs: packer/sources/remote_source.py lists a URL source,
packer/output/remote_output.py uploads parts to a URL output (packer/output/output_dir.py's
``LocalOutput`` is its local twin; both are an ``Output``). The pack itself is a ``PackJob``
(packer/engine/_job.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from packer.dedup.part_hashes import write_sidecar
from packer.engine._job import PackJob, PartsRun
from packer.engine._local_engine import run_local, run_local_kept
from packer.engine._part_plan import Plan, plan_parts
from packer.engine.parts import field_counts
from packer.output.output_dir import (
    LocalOutput,
    Output,
    OutputLock,
    check_not_source,
    open_output,
    remove_temporaries,
)
from packer.output.pack_order import ordered_items, write_source_paths
from packer.output.progress import fingerprint, load_progress, save_progress, writing
from packer.sources.remote_source import scan_place
from packer.sources.source import SourceScan
from packer.spec import PackSpec
from packer.transform.sizes import merge_sizes
from readers.errors import CallError, ImgpackError
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import open_writer, refuse_fields
from readers.formats.writer_base import FormatWriter, PartResult
from readers.remote.urls import is_url
from readers.store.manifest import PROGRESS_NAME, Manifest, write_manifest

StorageOptions = dict[str, Any] | None
MAX_ROUNDS = 4  # cuts re-planned as skips become known: 2 rounds at most for a stable source


@dataclass
class PackReport:
    out: str
    format: str
    packed: int
    skipped: int
    bytes: int
    seconds: float
    shards: int
    workers: int
    engine: str
    skipped_files: list[dict[str, str]] = field(default_factory=list)
    upscaled: int | None = None  # images enlarged on the way (None: unknown, resumed old pack)

    @property
    def images_per_second(self) -> float:
        return (self.packed + self.skipped) / self.seconds if self.seconds > 0 else 0.0


def pack_folder(
    src: str | os.PathLike | SourceScan,
    out: str | os.PathLike,
    fmt: str = "lmdb",
    spec: PreprocessSpec | None = None,
    *,
    base: tuple[Path, Manifest] | None = None,
    known: Any = None,
    **options: Any,
) -> PackReport:
    """Pack the image folder ``src`` (or an already scanned source) into ``out`` in format ``fmt``,
    preprocessed as ``spec`` says; ``options`` are the rest of ``packer.spec.PackSpec``'s keywords
    (``workers``, ``engine``, ``options`` (the format's own: ``shard_size``...), ``order``, ``seed``,
    ``force``, ``resume``, ``dedup``, ...), every one checked before the output is touched.

    The samples are written in a permutation of the source seeded by ``seed`` (``order="shuffled"``)
    or in the source order (``order="source"``); see packer/output/pack_order.py.
    ``src`` and ``out`` may be fsspec URLs (``s3://...``), opened with ``storage_options``.
    ``dedup`` ("exact" or "near", within ``near_distance`` bits) skips duplicates (packer/dedup/deduper.py).
    ``base``: (root, manifest) of a dataset the samples are appended to (packer/edit/append.py), and
    ``known`` its samples that ``dedup`` compares the new ones with (packer.dedup.deduper.Known)."""
    positional = {"source", "out", "format", "preprocess"}  # src, out, fmt, spec
    unknown = sorted(set(options) - {f.name for f in fields(PackSpec)} - positional)
    if unknown:
        raise CallError(f"pack_folder() does not take {', '.join(unknown)}; see packer.spec.PackSpec")
    asked = PackSpec(source=src, out=out, format=fmt, preprocess=spec or PreprocessSpec(), **options)
    return pack(asked, base=base, known=known)


def pack(asked: PackSpec, *, base: tuple[Path, Manifest] | None = None, known: Any = None) -> PackReport:
    """Run the pack ``asked`` describes (``base``, ``known``: see ``pack_folder``). What only the
    source or the format's writer can refuse is refused here, still before the output is touched."""
    started = time.perf_counter()
    writer = open_writer(asked.format, Path(asked.out), asked.preprocess, asked.options)
    if asked.engine == "ray":
        from packer.engine._ray_engine import check_ray_address

        check_ray_address(asked.ray_address)
    src = asked.source
    scan = src if isinstance(src, SourceScan) else scan_place(src, asked.storage_options)
    refuse_fields(writer.format, scan.fields)
    writer = writer.with_fields(scan.fields, scan.classes)
    if base is not None:
        writer = writer.extending(base[0], base[1].num_samples, len(base[1].shards))
    sink, work, lock = _open(scan, asked.out, asked.force, asked.resume, asked.storage_options)
    try:
        job = PackJob(pack=asked, scan=scan, spec=writer.spec, started=started, known=known)
        return _pack_into(job, writer.at(work), sink)
    finally:
        lock.release()


def _open(
    scan: SourceScan, out: str | os.PathLike, force: bool, resume: bool, storage_options: StorageOptions
) -> tuple[Output, Path, OutputLock]:
    """(where parts go, the folder they are written into, the lock held on it)."""
    if is_url(out):
        from packer.output.remote_output import RemoteOutput, same_place

        if same_place(scan.root, out):
            raise ImgpackError(f"{out}: the output overlaps the source {scan.root}; choose another -o")
        sink = RemoteOutput(str(out), storage_options)
        return (sink, *sink.open(force, resume))
    if not is_url(scan.root):
        check_not_source(scan.root, Path(out))
    return (LocalOutput(Path(out)), *open_output(Path(out), force, resume))


def _run_rounds(
    job: PackJob, writer: FormatWriter, sink: Output, items: Any, done: dict[int, PartResult], save: Any
) -> Plan:
    """Write the parts, re-planning the cut as the skips become known, until every part of the
    plan is written and fits it (packer/engine/_part_plan.py); the final plan."""
    from tqdm import tqdm

    per_part, by_kept = writer.samples_per_part(len(items)), writer.parts_hold_kept()
    carry: dict[str, Any] = {}  # what the engine keeps between rounds (Ray: carried results)
    for _ in range(MAX_ROUNDS):
        plan = plan_parts(len(items), per_part, by_kept, done)
        for p in [p for p, result in done.items() if not plan.fits(result, writer.stores_indices)]:
            sink.drop_part(writer, done.pop(p))  # cut otherwise now that more skips are known
        todo = [c for c in plan.cuts if c.part not in done]
        if not todo:
            break
        save()
        pool_fills = job.pack.engine == "local" and by_kept
        remaining = len(items) - plan.resume(done)[1] if pool_fills else sum(c.stop - c.start for c in todo)
        desc = f"pack {job.pack.format}"
        with tqdm(total=remaining, unit="img", disable=job.pack.quiet, desc=desc, dynamic_ncols=True) as bar:
            parts = [(c.part, items[c.start : c.stop]) for c in todo]
            firsts, starts = {c.part: c.first for c in todo}, {c.part: c.start for c in todo}
            run = PartsRun(writer, parts, done, sink, bar, save, firsts, starts, carry)
            if pool_fills:
                run_local_kept(job, run, items, plan, per_part)
            elif job.pack.engine == "local":
                run_local(job, run, items)
            else:
                from packer.engine._ray_engine import run_ray

                run_ray(job, run)
    else:
        raise ImgpackError(
            f"{job.scan.root}: files decoded differently on each attempt (changed while packing?); "
            "re-run with --resume once the source is stable"
        )
    return plan


def _pack_into(job: PackJob, writer: FormatWriter, sink: Output) -> PackReport:
    """The pack proper, by ``writer`` into ``writer.out`` (``out``, its staging sibling, or the
    local staging folder of a URL output), the lock on it held; ``sink`` takes the parts."""
    work, scan = writer.out, job.scan
    asked_order = job.order if job.dedup is None else {**job.order, "dedup": job.dedup}
    asked_print = fingerprint(scan, job.pack.format, job.spec, job.pack.options, asked_order)
    remove_temporaries(work)
    if job.pack.resume and not (work / PROGRESS_NAME).exists():
        print(f"{sink.location}: nothing to resume (no interrupted pack there); packing from the start",
              file=sys.stderr)  # fmt: skip
    done = load_progress(work, asked_print) if job.pack.resume else {}
    for p in [p for p, result in done.items() if not sink.part_intact(writer, result)]:
        del done[p]  # damaged by the interruption: written again

    def save() -> None:
        save_progress(work, asked_print, done)
        sink.saved(work)

    save()  # from the start: any kill leaves a resumable output
    items = ordered_items(scan.items, job.order["kind"], job.order["seed"])
    session: contextlib.AbstractContextManager = contextlib.nullcontext()
    if job.pack.engine == "ray":
        from packer.engine._ray_engine import ray_session

        session = ray_session(job.pack.ray_address)
    with session:
        plan = _run_rounds(job, writer, sink, items, done, save)
    parts = [(c.part, items[c.start : c.stop]) for c in plan.cuts]
    results = [done[p] for p, _ in parts]
    with writing(work, "source paths"):
        write_source_paths(work, parts, done)
    with writing(work, "dataset"):
        hashes = write_sidecar(work, results)  # before the finish: a remote one uploads it
        shards, extra = sink.finish(writer, results, scan.classes)
    # An append's own manifest numbers its shards from 0 (packer/edit/append.py shifts them back).
    shards = [replace(s, first=s.first - writer.index_base) for s in shards]
    skipped = scan.skipped + sorted((s for r in results for s in r.skipped), key=lambda s: s["path"])
    if not shards or sum(s.count for s in shards) == 0:
        first = f"{skipped[0]['path']}: {skipped[0]['reason']}" if skipped else "-"
        sink.discard(work)  # nothing to resume: a retry must not meet a half-made output
        raise ImgpackError(
            f"{scan.root}: every image was skipped ({len(skipped)}), so no dataset was written; "
            f"first reason: {first}"
        )
    manifest = Manifest(
        format=job.pack.format,
        num_samples=sum(s.count for s in shards),
        classes=scan.classes,
        encoding=job.spec.encode,
        preprocess=job.spec.to_dict(),
        shards=shards,
        skipped=skipped,
        stored_sizes=merge_sizes(r.extra for r in results),
        fields=dict(scan.fields),
        field_counts=field_counts(results),
        extra={
            **extra,
            **hashes,
            "source": _source_name(scan.root),
            "empty_classes": scan.empty_classes,
            "order": job.order,
        }
        | ({"dedup": job.dedup} if job.dedup else {})
        | scan.extra,
    )
    with writing(work, "manifest"):
        write_manifest(work, manifest)
    sink.commit(work)
    return PackReport(
        sink.location,
        job.pack.format,
        manifest.num_samples,
        len(skipped),
        sum(s.bytes for s in shards),
        time.perf_counter() - job.started,
        len(shards),
        job.pack.workers,
        job.pack.engine,
        skipped,
        (manifest.stored_sizes or {}).get("upscaled"),
    )


def _source_name(root: str | os.PathLike) -> str:
    return str(root) if is_url(root) else str(Path(root).resolve())
