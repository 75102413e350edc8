"""Views: a subset of a packed dataset, read like a dataset, with no image bytes of its own.

A view is a directory (or URL prefix) holding a sealed ``manifest.json`` whose ``format`` is
``"view"`` and one index file: the parent's sample indices it holds, sorted ascending, as
little-endian unsigned integers (``<u4``, or ``<u8`` for parents past 2**32 samples). The index
file is the manifest's one shard (``count`` = the view's samples, ``sha256`` checked on every
open), so the schema, the seal and ``pack verify`` treat it like any part. ``extra.view`` names
the parent (a path relative to the view, or a URL) and what it was when the view was made: its
manifest seal, sample count, sample identity and a digest of the parts holding those samples.

A view is not a registry format (``readers.formats.registry``) but a wrapper around the
parent's reader: it has no writer, no encodings and no parts of its own, so every "for each
format" matrix would have to skip it; ``open_reader`` returns a ``ViewReader`` that maps view
position ``i`` to parent index ``indices[i]`` and delegates everything else, so the parent's
checksums, remote parts, read-ahead and block reads apply unchanged. Indices are ascending, so a
block of consecutive view positions is a run of ascending parent indices: the parent's
``read_many`` merges near ones into one sequential read.

The parent may grow (an append adds parts and keeps every old index's sample): a view made on
an earlier version still reads as long as the parts that held its samples are listed as they
were. A parent re-packed in its place (other samples at those indices) is refused on open with
``ViewParentError`` naming both paths.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import ManifestError
from readers.formats.base import FormatReader
from readers.formats.part_files import PartFiles, check_regular, read_all, shards_holding
from readers.remote.urls import is_url, join_url, read_url
from readers.store.checksums import REMOTE_FIX, check_against_manifest, sha256_of_bytes
from readers.store.manifest import SEAL_FIELD, Manifest, json_text, read_manifest, seal_of
from readers.store.paths import inside
from readers.store.record import Record

VIEW_FORMAT = "view"
INDEX_DTYPES = {"<u4": 4, "<u8": 8}


class ViewParentError(ManifestError):
    """The parent of a view is missing or no longer holds the samples the view was made on."""


class ViewManifest(Manifest):
    """A view's manifest: its sample identity is its own (the indices it holds and the parent's
    identity when it was made), so a resume state of one view is refused on another."""

    def sample_identity(self) -> str:
        info = view_info(self)
        return f"view:{self.shards[0].sha256[:16]}:{info['parent_identity']}"


def is_view(manifest: Manifest) -> bool:
    return manifest.format == VIEW_FORMAT


def as_view_manifest(manifest: Manifest) -> ViewManifest:
    """``manifest`` (read from a view directory) as a ``ViewManifest``, its seal state kept."""
    view = ViewManifest(**{f.name: getattr(manifest, f.name) for f in dataclass_fields(Manifest)})
    view.__dict__.update({k: v for k, v in manifest.__dict__.items() if k.startswith("_")})
    view_info(view)  # checked now
    return view


def view_info(manifest: Manifest) -> dict[str, Any]:
    """``extra.view`` of a view manifest, its fields checked."""
    where = manifest.__dict__.get("_where", "manifest")
    info = manifest.extra.get("view") if isinstance(manifest.extra, dict) else None
    problem = None
    if not isinstance(info, dict):
        problem = "has no 'extra.view' object"
    elif not isinstance(info.get("parent"), str) or not info["parent"]:
        problem = "has no 'extra.view.parent' path"
    elif info.get("dtype") not in INDEX_DTYPES:
        problem = f"has 'extra.view.dtype' {info.get('dtype')!r}, not one of {', '.join(INDEX_DTYPES)}"
    elif any(type(info.get(k)) is not int for k in ("parent_num_samples", "parent_classes")) or not all(
        isinstance(info.get(k), str)
        for k in ("parent_identity", "parent_manifest_sha256", "parent_parts_sha256")
    ):
        problem = "lacks the parent's sample count, classes, identity or checksums"
    elif (
        len(manifest.shards) != 1
        or manifest.shards[0].bytes != manifest.num_samples * INDEX_DTYPES[info["dtype"]]
    ):
        problem = "does not list one index file of one integer per sample"
    if problem or not isinstance(info, dict):
        raise ManifestError(f"{where}: a view manifest that {problem}; make the view again with `pack view`")
    return info


def parent_location(view_root: str | os.PathLike, parent: str) -> str:
    """Where the parent named ``parent`` (relative to the view, or a URL) is."""
    if is_url(parent):
        return parent
    if is_url(view_root):
        scheme, _, rest = str(view_root).partition("://")
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest.rstrip('/'), parent))}"
    return os.path.normpath(os.path.join(os.fspath(view_root), parent))


def parts_digest(manifest: Manifest, samples: int) -> str:
    """sha256 of the shard entries that hold samples [0, samples): the same for every later
    version of a dataset that only appended parts after them."""
    held = [[s.file, s.first, s.count, s.sha256] for s in manifest.shards if s.first < samples]
    return hashlib.sha256(json_text(held).encode("utf-8", "surrogateescape")).hexdigest()


def parent_record(manifest: Manifest) -> dict[str, Any]:
    """What a view records of its parent's ``manifest`` when it is made."""
    return {
        "parent_manifest_sha256": stored_seal(manifest),
        "parent_num_samples": manifest.num_samples,
        "parent_identity": manifest.sample_identity(),
        "parent_format": manifest.format,
        "parent_parts_sha256": parts_digest(manifest, manifest.num_samples),
        "parent_classes": len(manifest.classes),
    }


def stored_seal(manifest: Manifest) -> str:
    """The seal ``manifest`` was read with (its file's ``manifest_sha256``), else computed."""
    return manifest.__dict__.get("_seal") or seal_of(asdict(manifest))


def check_parent(view_root: Any, parent_root: str, info: dict[str, Any], parent: Manifest) -> None:
    """Refuse a parent that no longer holds the samples the view was made on (ViewParentError)."""
    if is_view(parent):
        raise ViewParentError(
            f"{view_root}: its parent {parent_root} is itself a view; views name their root dataset "
            "(make the view again with `pack view`)"
        )
    if stored_seal(parent) == info.get("parent_manifest_sha256"):
        return
    count = info["parent_num_samples"]
    same = (
        parent.num_samples >= count
        and len(parent.classes) >= info["parent_classes"]
        and parts_digest(parent, count) == info.get("parent_parts_sha256")
    )
    if not same:
        raise ViewParentError(
            f"{view_root}: its parent {parent_root} was re-packed or changed since the view was made "
            f"(it held {count} samples in other parts); its indices no longer name the same samples: "
            f"make the view again from {parent_root} (pack view / pack split)"
        )


def read_index(
    root: str | os.PathLike, manifest: Manifest, storage_options: dict[str, Any] | None
) -> np.ndarray:
    """The view's parent indices (int64, ascending), its file checked against the manifest."""
    info = view_info(manifest)
    shard = manifest.shards[0]
    if is_url(root):
        where = join_url(str(root), shard.file)
        try:
            data = read_url(where, storage_options)
        except FileNotFoundError:
            raise ManifestError(f"{where}: the view's index file is missing; make the view again") from None
        check_against_manifest(where, sha256_of_bytes(data), shard.sha256, len(data), shard.bytes, REMOTE_FIX)
    else:
        path = Path(root) / shard.file
        where = str(path)
        inside(root, path, where)  # a symlink out of the view is refused
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise ManifestError(f"{where}: the view's index file is missing; make the view again") from None
        try:
            st = os.fstat(fd)
            check_regular(st, where)
            data = read_all(fd, shard.bytes + 1)
        finally:
            os.close(fd)
        check_against_manifest(where, sha256_of_bytes(data), shard.sha256, len(data), shard.bytes)
    indices = np.frombuffer(data, dtype=info["dtype"]).astype(np.int64)
    if indices.size and (np.any(np.diff(indices) <= 0) or indices[-1] >= info["parent_num_samples"]):
        raise ManifestError(
            f"{where}: indices not strictly ascending below the parent's {info['parent_num_samples']} "
            "samples although the file matches its checksum (resealed by hand?); make the view again"
        )
    return indices


def open_view(
    path: Any, manifest: Manifest, opener: Callable[..., FormatReader], verify: bool = False, **options: Any
) -> ViewReader:
    """The reader of the view at ``path`` whose manifest is ``manifest``; ``opener`` (``open_reader``,
    which calls this) opens the parent."""
    view = as_view_manifest(manifest)
    if verify:
        view.check_seal()
    info = view_info(view)
    parent_root = parent_location(path, info["parent"])
    indices = read_index(path, view, options.get("storage_options"))
    parent_options = dict(options)
    if not is_url(parent_root):  # a local parent of a remote view: no part cache to fill
        parent_options.pop("cache_dir", None)
        parent_options.pop("cache_size", None)
    try:
        parent = opener(parent_root, verify=verify, only_samples=indices, **parent_options)
    except ManifestError as exc:
        raise ViewParentError(f"{path}: its parent {parent_root} does not open: {exc}") from exc
    check_parent(path, parent_root, info, parent.manifest)
    if indices.size and indices[-1] >= len(parent):
        raise ViewParentError(
            f"{path}: holds index {indices[-1]} but its parent {parent_root} has {len(parent)} samples "
            "(the view's manifest was edited?); make the view again"
        )
    if parent.manifest.classes[: len(view.classes)] != view.classes:
        raise ViewParentError(
            f"{path}: its classes are not the first {len(view.classes)} of its parent {parent_root}'s "
            "(the view's manifest was edited, or the parent re-packed); make the view again"
        )
    return ViewReader(path, view, parent, indices, verify)


def view_source_paths(
    dataset: Any, storage_options: dict[str, Any] | None, lookup: Callable[..., list[str]]
) -> list[str] | None:
    """The source paths of the samples of ``dataset`` if it is a view (its parent's, from
    ``lookup(parent, storage_options)``, at its indices), else None."""
    try:
        manifest = read_manifest(dataset, storage_options)
    except ManifestError:
        return None
    if not is_view(manifest):
        return None
    parent = parent_location(dataset, view_info(manifest)["parent"])
    paths = lookup(parent, storage_options)
    indices = read_index(dataset, manifest, storage_options)
    if indices.size and indices[-1] >= len(paths):
        raise ManifestError(f"{parent}: source-paths.nul lists {len(paths)} paths, fewer than the view needs")
    return [paths[i] for i in indices.tolist()]


class ViewReader(FormatReader):
    """A view's samples: position ``i`` is the parent's sample ``indices[i]``."""

    def __init__(
        self, root: Any, manifest: ViewManifest, parent: FormatReader, indices: np.ndarray, verify: bool
    ):
        # Not FormatReader.__init__: a view has no parts, handles or cache of its own.
        self.root = root if is_url(root) else Path(root)
        self.manifest = manifest
        self.parent = parent
        self.indices = indices
        self.verify = verify
        self.remote = parent.remote
        self.parts = parent.parts
        self.cache_dir = parent.cache_dir
        self._handles: dict[Any, Any] = {}
        self._pid = os.getpid()
        self._identity = None
        self.ahead = None

    @property
    def _sha_checked(self) -> set[tuple]:  # type: ignore[override]
        return self.parent._sha_checked

    @_sha_checked.setter
    def _sha_checked(self, value: set[tuple]) -> None:
        self.parent._sha_checked = value

    @property
    def lowest_label(self) -> int:
        return self.parent.lowest_label

    def parent_indices(self, positions: Any) -> np.ndarray:
        return self.indices[np.asarray(positions, dtype=np.int64)]

    def describe(self, index: int) -> str:
        if not 0 <= index < len(self.indices):
            return f"{self.root} (a view), sample {index}"
        return f"{self.root} (a view), sample {index} = {self.parent.describe(int(self.indices[index]))}"

    def read(self, index: int) -> Record:
        return self.parent.read(int(self.indices[self.check_index(index)]))

    def read_block(self, start: int, stop: int) -> list[Record]:
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"block [{start}, {stop}) out of range for {len(self)} samples in {self.root}")
        return self.parent.read_many(self.indices[start:stop])

    def read_many(self, indices: Any) -> list[Record]:
        return self.parent.read_many(self.parent_indices(indices))

    def extents(self, indices: np.ndarray) -> Any:
        return self.parent.extents(self.parent_indices(indices))

    def fetch_ahead(self, planned: list[np.ndarray], settings: Any, rank: Any = None) -> Any:
        parent_rank = None if rank is None else rank.mapped(self.parent_indices)
        return self.parent.fetch_ahead([self.parent_indices(p) for p in planned], settings, parent_rank)

    def prime_ahead(self, rank: Any, settings: Any) -> list[Any]:
        return self.parent.prime_ahead(rank.mapped(self.parent_indices), settings)

    def stored_labels(self) -> np.ndarray | None:
        stored = self.parent.stored_labels()
        return None if stored is None else stored[self.indices]

    def labels(self) -> np.ndarray:
        stored = self.stored_labels()
        if stored is not None:
            return stored
        if type(self.parent).labels is not FormatReader.labels:  # the parent's own label table
            return self.parent.labels()[self.indices]
        return np.fromiter((r.label for r in self.read_block(0, len(self))), np.int64, count=len(self))

    def check_parts(self) -> None:
        self.parent.check_parts_of(shards_holding(self.parent.manifest, self.indices))

    def check_every_part(self) -> None:
        self.parent.check_every_part()

    def checked_parts(self) -> list[tuple[PartFiles, Any]]:
        used = self.__dict__.get("_used")
        if used is None:
            used = self._used = shards_holding(self.parent.manifest, self.indices)
        shards = self.parent.manifest.shards
        return [(self.parent, shards[p]) for p in used]

    def close(self) -> None:
        self.parent.close()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()


__all__ = [
    "SEAL_FIELD",
    "VIEW_FORMAT",
    "ViewManifest",
    "ViewParentError",
    "ViewReader",
    "is_view",
    "open_view",
]
