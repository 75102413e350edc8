"""The scanned source entries, stored compactly: a few bytes per file instead of Python objects.

A list of ``SourceItem`` dataclasses costs ~400 bytes per file (the object, its dict, two
strings, an int), ~4 GB at 10M files. ``SourceItems`` keeps the same entries as
- one byte string of the relative paths, each UTF-8 (``surrogateescape`` for names that are not
  UTF-8) and ended by a NUL byte, so the run of a range is exactly what the pack's fingerprint
  hashes;
- a NumPy array of the end offsets, an int32 array of labels;
- the absolute path as one shared prefix + the relative path (or, when entries do not follow
  that rule, a second byte string of paths);
and hands out ``SourceItem`` objects one at a time. A slice is a view (no copy), and a view
pickles only its own range, so a part sent to a pool worker or Ray task carries its entries only.

A folder scan writes the table into unlinked temporary files (``TMPDIR``) and maps them
read-only: the process's own memory stays flat, the ~55 bytes a file live in the page cache
(on a disk-backed ``TMPDIR`` the kernel drops and re-reads them as needed; forked pool workers
share them). A table made from a list stays in memory.
"""

from __future__ import annotations

import mmap
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

import numpy as np

ENCODING = ("utf-8", "surrogateescape")
DECODE_BLOCK = 4096  # entries decoded per step while iterating


@dataclass(frozen=True)
class SourceItem:
    index: int  # position in the sorted source order
    path: str  # absolute path
    rel: str  # posix path relative to the source root, as recorded in manifests
    label: int
    fields: str = ""  # the sample's fields, canonical JSON (readers.fields.field_schema.encode); "": none


def _encoded(text: str) -> bytes:
    return text.encode(*ENCODING) + b"\0"


class Strings:
    """Strings appended one at a time into one NUL-terminated byte run plus end offsets."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self.ends = array("q", [0])

    def add(self, text: str) -> None:
        self.blob += _encoded(text)
        self.ends.append(len(self.blob))

    def arrays(self) -> tuple[bytearray, np.ndarray]:
        """The run and its offsets, without a copy (the run is not appended to again)."""
        return self.blob, np.frombuffer(self.ends, dtype=np.int64)


class Spill:
    """Bytes appended to an unlinked temporary file, then mapped read-only: the kernel keeps
    them in the page cache (dropped and read back under memory pressure), not the process."""

    def __init__(self, first: bytes = b"") -> None:
        self.file = tempfile.TemporaryFile(prefix="imgpack-scan-")
        self.write = self.file.write
        self.write(first)

    def mapped(self) -> mmap.mmap | bytes:
        self.file.flush()
        size = self.file.tell()
        try:
            return mmap.mmap(self.file.fileno(), size, access=mmap.ACCESS_READ) if size else b""
        finally:
            self.file.close()  # the mapping keeps the data; the file has no name to leave behind


class ItemsBuilder:
    """Collects (rel, label) entries in source order into temporary files (``Spill``), so the
    scan's memory does not grow with the source; ``build`` maps them as ``SourceItems``."""

    FLUSH = 1 << 16  # offsets and labels buffered per write

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.rels, self.ends, self.labels = Spill(), Spill(array("q", [0]).tobytes()), Spill()
        self.pending_ends, self.pending_labels = array("q"), array("i")  # "i": int32 everywhere
        self.size = self.count = 0

    def add(self, rel: str, label: int) -> None:
        data = _encoded(rel)
        self.rels.write(data)
        self.size += len(data)
        self.pending_ends.append(self.size)
        self.pending_labels.append(label)
        self.count += 1
        if len(self.pending_labels) >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        self.ends.write(self.pending_ends.tobytes())
        self.labels.write(self.pending_labels.tobytes())
        del self.pending_ends[:], self.pending_labels[:]

    def __len__(self) -> int:
        return self.count

    def build(self) -> SourceItems:
        self._flush()
        ends = np.frombuffer(self.ends.mapped(), dtype=np.int64)
        labels = np.frombuffer(self.labels.mapped(), dtype=np.int32)
        return SourceItems(self.rels.mapped(), ends, labels, self.prefix)


class SourceItems(Sequence):
    """A sequence of ``SourceItem`` (len, iteration, index, slice), stored as described above."""

    def __init__(
        self,
        rels: bytes | bytearray | mmap.mmap,
        ends: np.ndarray,
        labels: np.ndarray,
        prefix: str = "",
        paths: tuple[bytes | bytearray | mmap.mmap, np.ndarray] | None = None,
        first_index: int = 0,
        indices: np.ndarray | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> None:
        self._rels, self._ends, self._labels = rels, ends, labels
        self._prefix, self._paths = prefix, paths
        self._fields: tuple[bytes | bytearray | mmap.mmap, np.ndarray] | None = None
        self._first_index, self._indices = first_index, indices  # indices: None = consecutive
        self._rows: np.ndarray | None = None  # position -> stored entry; None: the stored order
        self._start = start
        self._stop = len(labels) if stop is None else stop

    def reordered(self, rows: np.ndarray) -> SourceItems:
        """These entries in the order ``rows`` (a permutation of ``range(len(self))``), as a view:
        the table is not copied, only ``rows`` (8 bytes an entry) is kept."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) != len(self) or (len(rows) and not np.array_equal(np.sort(rows), np.arange(len(rows)))):
            raise ValueError(f"rows must be a permutation of the {len(self)} entries")
        view = object.__new__(SourceItems)
        view.__dict__.update(self.__dict__)
        view._rows = self._stored(np.arange(self._start, self._stop))[rows]
        view._start, view._stop = 0, len(rows)
        return view

    def _stored(self, positions: np.ndarray) -> np.ndarray:
        """The stored entries at ``positions`` (positions into ``_rows`` when reordered)."""
        return positions if self._rows is None else self._rows[positions]

    @classmethod
    def from_items(cls, items: Iterable[Any]) -> SourceItems:
        """The compact form of ``SourceItem`` objects (any order, any paths: kept exactly)."""
        items = list(items)
        rels, paths, labels, fields = Strings(), Strings(), array("i"), Strings()
        indices = np.fromiter((item.index for item in items), np.int64, count=len(items))
        prefix: str | Literal[False] | None = None
        for item in items:
            rels.add(item.rel)
            paths.add(item.path)
            fields.add(getattr(item, "fields", ""))
            labels.append(item.label)
            if prefix is None:
                tail = item.path.endswith(item.rel)
                prefix = item.path[: len(item.path) - len(item.rel)] if tail else False
            if prefix is not False and item.path != prefix + item.rel:
                prefix = False  # no shared prefix: the paths are kept as they are
        rel_blob, rel_ends = rels.arrays()
        keep_paths = paths.arrays() if prefix is False or not items else None
        consecutive = not len(indices) or bool((indices == indices[0] + np.arange(len(indices))).all())
        table = cls(
            rel_blob,
            rel_ends,
            np.frombuffer(labels, dtype=np.int32),
            prefix or "",
            keep_paths,
            int(indices[0]) if consecutive and len(indices) else 0,
            None if consecutive else indices,
        )
        if any(getattr(item, "fields", "") for item in items):
            table._fields = fields.arrays()  # one JSON document per entry, like the paths
        return table

    # -- the sequence ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            view = object.__new__(SourceItems)
            view.__dict__.update(self.__dict__)
            view._start, view._stop = self._start + start, self._start + max(start, stop)
            return view
        k = int(key)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"source item {key} out of range for {len(self)} items")
        return next(self._decode(self._start + k, self._start + k + 1))

    def __iter__(self) -> Iterator[Any]:
        for a in range(self._start, self._stop, DECODE_BLOCK):
            yield from self._decode(a, min(self._stop, a + DECODE_BLOCK))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SourceItems({len(self)} items)"

    def _decode(self, a: int, b: int) -> Iterator[Any]:
        if self._rows is not None:
            yield from self._decode_rows(self._rows[a:b])
            return
        ends = self._ends[a : b + 1].tolist()
        labels = self._labels[a:b].tolist()
        if self._indices is not None:
            indices: Iterable[int] = self._indices[a:b].tolist()
        else:
            indices = range(self._first_index + a, self._first_index + b)
        paths = iter(()) if self._paths is None else _split(*self._paths, a, b)
        fields = _split(*self._fields, a, b) if self._fields is not None else None
        rels, prefix = self._rels, self._prefix
        for k, (index, label) in enumerate(zip(indices, labels)):
            rel = rels[ends[k] : ends[k + 1] - 1].decode(*ENCODING)
            path = next(paths) if self._paths is not None else prefix + rel
            yield SourceItem(index, path, rel, label, next(fields) if fields is not None else "")

    def _decode_rows(self, rows: np.ndarray) -> Iterator[Any]:
        starts, stops = self._ends[rows].tolist(), self._ends[rows + 1].tolist()
        labels = self._labels[rows].tolist()
        indices = (self._indices[rows] if self._indices is not None else rows + self._first_index).tolist()
        path_ends = None if self._paths is None else self._paths[1]
        for k, (index, label) in enumerate(zip(indices, labels)):
            rel = self._rels[starts[k] : stops[k] - 1].decode(*ENCODING)
            if path_ends is None:
                path = self._prefix + rel
            else:
                row = int(rows[k])
                path = self._paths[0][int(path_ends[row]) : int(path_ends[row + 1]) - 1].decode(*ENCODING)  # type: ignore[index]
            yield SourceItem(index, path, rel, label, self._field_text(int(rows[k])))

    def _field_text(self, row: int) -> str:
        if self._fields is None:
            return ""
        blob, ends = self._fields
        return blob[int(ends[row]) : int(ends[row + 1]) - 1].decode(*ENCODING)

    # -- whole ranges ----------------------------------------------------------------------------
    def rel_bytes(self) -> memoryview:
        """Every relative path of this range, encoded and NUL-terminated, back to back (no copy
        unless reordered)."""
        if self._rows is not None:
            return memoryview(b"".join(self.rel_runs()))
        return memoryview(self._rels)[int(self._ends[self._start]) : int(self._ends[self._stop])]

    def rel_runs(self, rows: np.ndarray | None = None, step: int = 1 << 16) -> Iterator[bytes]:
        """The relative paths of the entries at ``rows`` (positions in this range; all of them by
        default), encoded and NUL-terminated, in pieces of ``step`` entries gathered by NumPy."""
        positions = np.arange(self._start, self._stop) if rows is None else self._start + np.asarray(rows)
        for a in range(0, len(positions), step):
            blob, _ = _gather(self._rels, self._ends, self._stored(positions[a : a + step]))
            yield blob

    def labels(self) -> np.ndarray:
        return self._labels[self._stored(np.arange(self._start, self._stop))]

    def nbytes(self) -> int:
        """Memory held by the whole table this range is a view of."""
        extra = 0 if self._paths is None else len(self._paths[0]) + self._paths[1].nbytes
        extra += 0 if self._indices is None else self._indices.nbytes
        extra += 0 if self._fields is None else len(self._fields[0]) + self._fields[1].nbytes
        return len(self._rels) + self._ends.nbytes + self._labels.nbytes + extra

    def _compact_state(self) -> tuple[tuple, tuple | None]:
        """The constructor arguments (and fields) of a plain table holding this reordered range."""
        rows = self._rows[self._start : self._stop]  # type: ignore[index]
        rels, ends = _gather(self._rels, self._ends, rows)
        paths = None if self._paths is None else _gather(*self._paths, rows)
        indices = self._indices[rows] if self._indices is not None else rows + self._first_index
        fields = None if self._fields is None else _gather(*self._fields, rows)
        return (rels, ends, self._labels[rows].copy(), self._prefix, paths, 0, indices), fields

    def __reduce__(self) -> tuple:
        """Pickled as its own range only (a part sent to a worker does not carry the rest)."""
        if self._rows is not None:
            return (_rebuilt, self._compact_state())
        a, b = self._start, self._stop
        lo, hi = int(self._ends[a]), int(self._ends[b])
        paths = None
        if self._paths is not None:
            blob, ends = self._paths
            p_lo, p_hi = int(ends[a]), int(ends[b])
            paths = (blob[p_lo:p_hi], ends[a : b + 1] - p_lo)
        indices = None if self._indices is None else self._indices[a:b].copy()
        state = (self._rels[lo:hi], self._ends[a : b + 1] - lo, self._labels[a:b].copy(), self._prefix,
                 paths, self._first_index + a, indices)  # fmt: skip
        fields = None
        if self._fields is not None:
            blob, ends = self._fields
            f_lo, f_hi = int(ends[a]), int(ends[b])
            fields = (blob[f_lo:f_hi], ends[a : b + 1] - f_lo)
        return (_rebuilt, (state, fields))


def _rebuilt(state: tuple, fields: tuple | None) -> SourceItems:
    items = SourceItems(*state)
    items._fields = fields
    return items

def _gather(
    blob: bytes | bytearray | mmap.mmap, ends: np.ndarray, rows: np.ndarray
) -> tuple[bytes, np.ndarray]:
    """The NUL-terminated strings ``rows`` of a run, back to back, and their end offsets."""
    starts = ends[rows]
    lengths = ends[rows + 1] - starts
    new_ends = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_ends[1:])
    picks = np.repeat(starts - new_ends[:-1], lengths) + np.arange(new_ends[-1], dtype=np.int64)
    return np.frombuffer(blob, dtype=np.uint8)[picks].tobytes(), new_ends


def _split(blob: bytes | bytearray | mmap.mmap, ends: np.ndarray, a: int, b: int) -> Iterator[str]:
    bounds = ends[a : b + 1].tolist()
    for k in range(b - a):
        yield blob[bounds[k] : bounds[k + 1] - 1].decode(*ENCODING)


def rel_run(items: Iterable[Any]) -> bytes | memoryview:
    """Every item's relative path, encoded and NUL-terminated, back to back (what a pack's
    fingerprint hashes); without a copy for ``SourceItems``."""
    if isinstance(items, SourceItems):
        return items.rel_bytes()
    return b"".join(_encoded(item.rel) for item in items)


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of ``size`` consecutive items (the last may be shorter), read lazily."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk
