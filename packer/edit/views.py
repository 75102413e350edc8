"""Making views (readers/datasets/views.py): an index list, the complement of one, or a hash-based split.

``write_view(DS, OUT, indices)`` writes OUT/manifest.json and OUT/indices.u32 naming DS as the
parent; no image byte is copied. A view of a view names the root dataset (its indices mapped
through). ``split_views(DS, OUT, val=0.05, seed=0)`` writes OUT/train and OUT/val.

The split is a pure function of (seed, a stable per-sample key): a sample is in ``val`` when the
first 8 bytes of sha256("imgpack-split", seed, key), read as a fraction of 2**64, fall below
``val``. The key is the sample's relative source path (``source-paths.nul``, written by every
pack), so a sample keeps its side when the dataset grows (an append) or is re-packed from a
bigger source; ``key="index"`` uses the dataset index instead (stable under appends only), for
packs made before imgpack recorded source paths.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from readers.datasets.views import VIEW_FORMAT, ViewReader, parent_record
from readers.errors import ManifestError, OptionError
from readers.formats import FormatReader, open_reader
from readers.remote.urls import is_url, join_url, url_fs
from readers.store.checksums import sha256_of_bytes
from readers.store.manifest import MANIFEST_NAME, Manifest, Shard, read_manifest, write_atomic
from readers.store.sample_sources import source_paths

SPLIT_KEYS = ("path", "index")
INDEX_NAMES = {"<u4": "indices.u32", "<u8": "indices.u64"}
SPLIT_SALT = "imgpack-split"


@dataclass
class ViewResult:
    path: str
    parent: str
    samples: int
    parent_samples: int
    index_bytes: int


def read_index_list(path: str | os.PathLike) -> np.ndarray:
    """The indices in ``path``: one per line, '#' comment lines and blank lines ignored (the
    format ``pack dups`` and ``pack overlap --indices-out`` write)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"{path}: cannot read the index list ({exc})") from None
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        if not item.isdigit():
            raise OptionError(
                f"{path}:{number}: {item[:40]!r} is not a dataset index; give one index (0, 1, ...) "
                "per line ('#' starts a comment line)"
            )
        values.append(int(item))
    return np.asarray(values, dtype=np.int64)


def complement(count: int, dropped: np.ndarray) -> np.ndarray:
    keep = np.ones(count, dtype=bool)
    keep[dropped] = False
    return np.flatnonzero(keep)


def write_view(
    dataset: str | os.PathLike,
    out: str | os.PathLike,
    indices: Sequence[int] | np.ndarray,
    *,
    made: dict[str, Any] | None = None,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> ViewResult:
    """Write a view of ``dataset``'s samples ``indices`` (its own indices; duplicates are merged,
    the order is ascending) at ``out``; ``made``: how it was chosen, recorded in the manifest."""
    reader = open_reader(dataset, storage_options=storage_options)
    try:
        return _write(str(dataset), str(out), reader, np.asarray(indices, dtype=np.int64), made, force,
                      storage_options)  # fmt: skip
    finally:
        reader.close()


def _write(
    dataset: str, out: str, reader: FormatReader, wanted: np.ndarray, made: dict[str, Any] | None,
    force: bool, storage_options: dict[str, Any] | None,
) -> ViewResult:  # fmt: skip
    wanted = np.unique(wanted)
    if wanted.size and (wanted[0] < 0 or wanted[-1] >= len(reader)):
        bad = int(wanted[0] if wanted[0] < 0 else wanted[-1])
        raise OptionError(
            f"{dataset}: index {bad} is outside its {len(reader)} samples (0..{len(reader) - 1})"
        )
    if wanted.size == 0:
        raise OptionError(f"{out}: the view would hold no samples of {dataset}; give at least one index")
    root, root_reader, indices = dataset, reader, wanted
    if isinstance(reader, ViewReader):  # a view of a view is a view of the root dataset
        root_reader = reader.parent
        root = str(root_reader.root)
        indices = reader.indices[wanted]
    parent = root_reader.manifest
    dtype = "<u4" if parent.num_samples <= 1 << 32 else "<u8"
    data = indices.astype(dtype).tobytes()
    name = INDEX_NAMES[dtype]
    info = {
        "parent": parent_reference(root, out),
        "dtype": dtype,
        **parent_record(parent),
        "made": made or {},
    }
    order = parent.extra.get("order") or {}
    manifest = Manifest(
        format=VIEW_FORMAT,
        num_samples=int(indices.size),
        classes=list(parent.classes),
        encoding=parent.encoding,
        preprocess=dict(parent.preprocess),
        shards=[Shard(name, 0, int(indices.size), len(data), sha256_of_bytes(data))],
        extra={
            "view": info,
            "order": {
                "kind": order.get("kind", "source"),
                "seed": order.get("seed"),
                "paths": "the parent's",
            },
        },
        stored_sizes=parent.stored_sizes,
        fields=dict(parent.fields),
    )
    manifest.validate(out)
    if not is_url(out) and not is_url(root):
        real_out, real_root = os.path.realpath(out), os.path.realpath(root)
        if real_out == real_root or real_out.startswith(real_root.rstrip(os.sep) + os.sep):
            raise OptionError(f"{out}: is inside the dataset {root}; write the view to a directory beside it")
    _store(out, name, data, manifest, force, storage_options)
    return ViewResult(out, root, int(indices.size), parent.num_samples, len(data))


def parent_reference(parent: str, out: str) -> str:
    """How the view at ``out`` names ``parent``: a relative path where both are local or in one
    bucket (the pair can be moved together), else the parent's URL."""
    if not is_url(out):
        return parent if is_url(parent) else os.path.relpath(os.path.abspath(parent), os.path.abspath(out))
    if not is_url(parent):
        raise OptionError(
            f"{out}: a view in object storage cannot name the local dataset {parent}; upload the "
            "dataset and make the view from its URL"
        )
    (p_scheme, _, p_rest), (o_scheme, _, o_rest) = parent.partition("://"), out.partition("://")
    if p_scheme != o_scheme or p_rest.split("/")[0] != o_rest.split("/")[0]:
        return parent
    return posixpath.relpath("/" + p_rest.strip("/"), "/" + o_rest.strip("/"))


def _store(
    out: str, name: str, data: bytes, manifest: Manifest, force: bool, options: dict[str, Any] | None
) -> None:
    """The index file, then the manifest (last, atomically where the storage allows)."""
    _check_target(out, force, options)
    text = manifest.to_json()
    if is_url(out):
        fs, path = url_fs(out, options)
        fs.pipe_file(join_url(path, name), data)
        fs.pipe_file(join_url(path, MANIFEST_NAME), text.encode("utf-8"))
        return
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("indices.u*"):
        if old.name != name:
            old.unlink()
    write_atomic(target / name, data)
    write_atomic(target / MANIFEST_NAME, text)


def _check_target(out: str, force: bool, options: dict[str, Any] | None) -> None:
    """Refuse to write over anything but an earlier view (and over that only with ``force``)."""
    try:
        existing = read_manifest(out, options)
    except ManifestError:
        existing = None
    if existing is not None and existing.format != VIEW_FORMAT:
        raise OptionError(f"{out}: holds a packed {existing.format} dataset, not a view; choose another -o")
    if existing is not None and not force:
        raise OptionError(f"{out}: a view exists there already; pass --force to replace it")
    if existing is None and not is_url(out) and Path(out).exists():
        if Path(out).is_file() or any(Path(out).iterdir()):
            raise OptionError(f"{out}: exists and is not a view; choose an empty or new directory")


def split_keys(
    reader: FormatReader, dataset: str, key: str, storage_options: dict[str, Any] | None
) -> list[str]:
    """The stable key of each sample of ``reader`` (opened on ``dataset``, or a view), as text."""
    if key not in SPLIT_KEYS:
        raise OptionError(f"--key {key!r}: choose one of {', '.join(SPLIT_KEYS)}")
    if key == "index":  # a view: its root dataset's indices
        at = reader.indices if isinstance(reader, ViewReader) else np.arange(len(reader))
        return [str(i) for i in at.tolist()]
    try:
        paths = source_paths(dataset, storage_options)
    except ManifestError as exc:
        raise ManifestError(f"{exc}; or split by dataset index with --key index") from None
    if len(paths) != len(reader):
        raise ManifestError(
            f"{dataset}: source-paths.nul lists {len(paths)} paths for {len(reader)} samples; "
            "re-pack the dataset, or split by dataset index with --key index"
        )
    return paths


def in_val(keys: Sequence[str], val: float, seed: int) -> np.ndarray:
    """Whether each key falls in the validation side of the split ``(val, seed)``."""
    bound = int(val * (1 << 64))
    prefix = f"{SPLIT_SALT}\0{seed}\0".encode()
    out = np.empty(len(keys), dtype=bool)
    for i, key in enumerate(keys):
        digest = hashlib.sha256(prefix + key.encode("utf-8", "surrogateescape")).digest()
        out[i] = int.from_bytes(digest[:8], "big") < bound
    return out


def split_views(
    dataset: str | os.PathLike,
    out: str | os.PathLike,
    *,
    val: float,
    seed: int = 0,
    key: str = "path",
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, ViewResult]:
    """Views ``out/train`` and ``out/val`` of ``dataset``: disjoint, together every sample."""
    if not 0.0 < val < 1.0:
        raise OptionError(f"--val {val}: give the validation fraction, between 0 and 1 (e.g. 0.05)")
    reader = open_reader(dataset, storage_options=storage_options)
    try:
        chosen = in_val(split_keys(reader, str(dataset), key, storage_options), val, seed)
        made = {"by": "split", "val": val, "seed": seed, "key": key}
        sides = {"train": np.flatnonzero(~chosen), "val": np.flatnonzero(chosen)}
        for side, indices in sides.items():
            if indices.size == 0:
                raise OptionError(
                    f"{dataset}: no sample of its {len(reader)} falls in {side} with --val {val}; "
                    "change --val (or --seed)"
                )
        for side in sides:  # both refused before either is written
            _check_target(join_out(str(out), side), force, storage_options)
        return {
            side: _write(
                str(dataset),
                join_out(str(out), side),
                reader,
                indices,
                {**made, "side": side},
                force,
                storage_options,
            )  # fmt: skip
            for side, indices in sides.items()
        }
    finally:
        reader.close()


def join_out(out: str, name: str) -> str:
    return join_url(out, name) if is_url(out) else os.path.join(out, name)


def describe_view(manifest: Manifest) -> list[str]:
    """``pack info``'s lines for a view (none for a dataset)."""
    if manifest.format != VIEW_FORMAT:
        return []
    info = manifest.extra["view"]
    made = info.get("made") or {}
    how = ", ".join(f"{k}={v}" for k, v in made.items())
    return [
        f"view of  {info['parent']} ({info['parent_format']}, {info['parent_num_samples']} samples "
        f"when made{'; ' + how if how else ''}); no image bytes of its own",
    ]


__all__ = ["read_index_list", "split_views", "write_view"]
