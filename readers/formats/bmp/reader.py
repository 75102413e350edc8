"""The BMP cache: pre-resized ``OUT/<class>/<stem>.bmp`` files mirroring the source tree.

On-disk layout (shared with writer.py beside it):
- ``<class>/[<subdir>/]<stem>.bmp``: 24-bit BGR (8-bit grey palette for ``--mode L``), rows
  top-down, so the tree is also a torchvision ImageFolder (every class of the manifest has a
  folder, so ImageFolder's labels equal imgpack's; an empty one needs ``allow_empty=True``);
- ``files-000000.jsonl`` (one per shard, the file the manifest's shard checksum covers): a
  header object ``{"format": "imgpack-bmp-index", "version", "first", "count", "columns"}``,
  then one JSON array per sample in dataset order:
  ``[file, label, height, width, channels, bytes, crc32, source]`` with ``file`` relative to the
  dataset root and ``source`` the source path it was made from. The CRC32
  (``readers.store.record.record_crc``: label, shape and file bytes) makes ``pack verify`` (and
  ``verify=True`` readers) catch a changed ``.bmp`` or row, and the index's sha256 in the
  manifest covers the list and those CRCs (checked when the index is loaded with ``verify=True``).
The per-sample list lives in these sidecars rather than in manifest.json so that the manifest
stays small (``pack info`` on a million-image cache) and each shard has one file to checksum.
"""

from __future__ import annotations

import errno
import functools
import json
import os
from pathlib import Path

import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.formats.base import FormatReader
from readers.remote.readahead import Extent
from readers.store.paths import check_names, inside
from readers.store.record import Record, record_crc

INDEX_FORMAT = "imgpack-bmp-index"
INDEX_VERSION = 1
COLUMNS = ["file", "label", "height", "width", "channels", "bytes", "crc32", "source"]


def index_name(position: int) -> str:
    return f"files-{position:06d}.jsonl"


def index_header(first: int, count: int) -> str:
    header = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "first": first, "count": count}
    return json.dumps({**header, "columns": COLUMNS})


def read_index(path: Path) -> tuple[dict, list[list]]:
    """(header, rows) of one index file; rows as described in the module docstring."""
    try:
        with open(path, encoding="ascii") as fh:
            header = json.loads(fh.readline())
            rows = json.loads("[" + ",".join(line for line in fh if line.strip()) + "]")
    except FileNotFoundError:
        raise ManifestError(f"{path}: BMP cache index listed in the manifest is missing; re-pack") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable BMP cache index ({exc}); re-pack the dataset") from None
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise ManifestError(f"{path}: not an imgpack BMP cache index; re-pack the dataset")
    return header, rows


class BmpIndex:
    """Every sample's file and metadata as NumPy arrays (compact, shared copy-on-write after fork)."""

    def __init__(self, reader: BmpReader) -> None:
        root, manifest = reader.root, reader.manifest
        # Per shard: its rows are parsed, packed into arrays and dropped, so no per-sample
        # Python object outlives one shard.
        blobs: list[bytes] = []
        field_texts: list[bytes] = []  # each sample's fields (the index's 9th column), if any
        lengths = [np.zeros(0, np.int64)]
        tables = [np.zeros((0, 6), np.int64)]
        for shard in manifest.shards:
            path = Path(reader.local_file(shard))  # behind a URL: the index's copy in the cache
            if path.is_file():
                reader.check_sha256(path, shard.sha256, reader.location(shard.file))
            header, rows = read_index(path)
            if header.get("count") != shard.count or len(rows) != shard.count:
                raise ManifestError(
                    f"{path}: lists {len(rows)} files, the manifest says {shard.count}; re-pack"
                )
            try:
                table = np.array([row[1:7] for row in rows], dtype=np.int64).reshape(-1, 6)
                part_names = [row[0] for row in rows]
            except (TypeError, ValueError, IndexError, OverflowError) as exc:
                raise ManifestError(f"{path}: malformed row in the cache index ({exc}); re-pack") from None
            if len(table) != len(rows) or (table[:, 1:] < 0).any():
                raise ManifestError(f"{path}: malformed row in the BMP cache index; re-pack the dataset")
            check_names(part_names, str(path), "file")
            if manifest.fields:
                field_texts += [str(row[8]).encode() if len(row) > 8 else b"" for row in rows]
            encoded = [os.fsencode(n) for n in part_names]
            blobs.append(b"".join(encoded))
            lengths.append(np.fromiter(map(len, encoded), np.int64, count=len(encoded)))
            tables.append(table)
            del rows, part_names, encoded
        table = np.concatenate(tables)
        self.labels = table[:, 0].copy()
        reader.check_labels(self.labels, f"{root}: BMP cache index")
        self.shapes = table[:, 1:4].copy()
        self.sizes = table[:, 4].copy()
        self.crc = table[:, 5].copy()
        self.ends = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
        self.names = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        self.fields = field_texts or None
        self.root = os.fsencode(str(root).rstrip("/")) + b"/"
        self.dir_fd = -1
        if reader.remote:  # files are fetched by URL, one request each (BmpReader.read)
            return
        # Files are opened relative to the directory as it was when the index was read: a
        # `pack --force` swaps a new dataset in under the same path, and this index must never
        # be paired with the new files (the old ones are deleted, so reads then fail clearly).
        self.dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.real_root = os.path.realpath(root)
        self.safe_dirs: set[bytes] = set()

    def path(self, index: int) -> bytes:
        return self.root + self.name(index)

    def name(self, index: int) -> bytes:
        return self.names[self.ends[index] : self.ends[index + 1]].tobytes()

    def __del__(self) -> None:
        if getattr(self, "dir_fd", -1) >= 0:
            os.close(self.dir_fd)

    def open(self, index: int, where: str) -> int:
        """A read-only descriptor for file ``index``, opened relative to the indexed directory,
        refused if a symlink leads it out of the dataset."""
        name, path = self.name(index), self.path(index)
        folder = os.path.dirname(path)
        if folder not in self.safe_dirs:  # checked once per folder and process
            inside(self.real_root, os.fsdecode(folder), where)
            self.safe_dirs.add(folder)
        flags = os.O_RDONLY | os.O_CLOEXEC
        try:
            return os.open(name, flags | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the file itself is a symlink: allowed if it stays inside
                inside(self.real_root, os.fsdecode(path), where)
                return os.open(name, flags, dir_fd=self.dir_fd)
            raise


class BmpReader(FormatReader):
    merge_gap = 1  # one file per image: reading the files in a gap would only throw them away
    oldest_format_version = 2  # the index's crc32 covers label and shape since format_version 2

    _index: BmpIndex | None = None  # parsed on first use

    def checksum_size(self, shard) -> None:
        return None  # a shard's ``bytes`` counts its images, not its index file

    @property
    def index(self) -> BmpIndex:
        return self.handle("index")

    def check_parts(self) -> None:
        self.handle("index")  # parsed and checked here; forked workers share the arrays

    def _open(self, key: str) -> BmpIndex:
        # Parsed once: a forked worker reuses its parent's arrays (shared copy-on-write).
        if self._index is None:
            self._index = BmpIndex(self)
        return self._index

    def _close_handle(self, handle) -> None:
        pass  # the index is plain arrays, kept for forked workers

    def __getstate__(self):
        state = super().__getstate__()
        state["_index"] = None  # rebuilt on first use; keeps pickled readers small
        return state

    def read(self, index: int) -> Record:
        index = self.check_index(index)
        idx = self.index
        where = self.describe(index)
        try:
            if self.parts is not None:
                data = self.parts.read(os.fsdecode(idx.name(index)))
            else:
                fd = idx.open(index, where)
                with open(fd, "rb", buffering=0) as fh:
                    data = fh.readall()
        except FileNotFoundError as exc:
            self.check_not_replaced(exc)  # the old files are deleted after a swap: say so
            raise ManifestError(
                f"{where}: file of the BMP cache is missing (re-packed with --force while open? open "
                "the dataset again); otherwise re-pack"
            ) from None
        except OSError as exc:
            raise ManifestError(f"{where}: cannot read it ({exc.strerror}); fix it or re-pack") from None
        height, width, channels = idx.shapes[index].tolist()
        label = int(idx.labels[index])
        fields = idx.fields[index] if idx.fields is not None else b""
        # Remote files are always checked: no sha256 covers them, and the CRC costs little next
        # to a request.
        if (self.verify or self.parts is not None) and (
            len(data) != idx.sizes[index]
            or record_crc(data, label, height, width, channels, "bmp", fields) != idx.crc[index]
        ):
            raise ChecksumError(f"{where}: does not match its checksum in the cache index (corrupt)")
        record = Record(data, label, height, width, channels, "bmp", fields)
        return self.typed_fields(record, index) if self.manifest.fields else record

    def describe(self, index: int) -> str:
        return f"{super().describe(index)} ({os.fsdecode(self.index.path(index))})"

    def extents(self, indices) -> list[Extent] | None:
        """Each image's whole file, opened (by the hinting threads) the way a read opens it."""
        idx = self._handles.get("index") if self._pid == os.getpid() else None
        if idx is None or idx.dir_fd < 0:  # not open yet, or behind a URL
            return None if idx is None else []
        where = str(self.root)
        sizes = idx.sizes
        wanted = np.asarray(indices).tolist()
        return [Extent(functools.partial(idx.open, i, where), 0, int(sizes[i]), i) for i in wanted]

    def read_block(self, start: int, stop: int) -> list[Record]:
        # One file per image: there is no single sequential read to make here.
        return [self.read(i) for i in range(start, stop)]

    def labels(self) -> np.ndarray:
        return self.index.labels.copy()
