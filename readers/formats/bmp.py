"""The BMP cache: pre-resized ``OUT/<class>/<stem>.bmp`` files mirroring the source tree.

On-disk layout (shared with the writer in packer/formats/bmp.py):
- ``<class>/[<subdir>/]<stem>.bmp``: 24-bit BGR (8-bit grey palette for ``--mode L``), rows
  top-down, so the tree is also a torchvision ImageFolder (every class of the manifest has a
  folder, so ImageFolder's labels equal imgpack's; an empty one needs ``allow_empty=True``);
- ``files-000000.jsonl`` (one per shard, the file the manifest's shard checksum covers): a
  header object ``{"format": "imgpack-bmp-index", "version", "first", "count", "columns"}``,
  then one JSON array per sample in dataset order:
  ``[file, label, height, width, channels, bytes, crc32, source]`` with ``file`` relative to the
  dataset root and ``source`` the source path it was made from. The per-file CRC32 makes
  ``pack verify`` (and ``verify=True`` readers) catch a changed ``.bmp``, and the index's sha256
  in the manifest covers the list and those CRCs.
The per-sample list lives in these sidecars rather than in manifest.json so that the manifest
stays small (``pack info`` on a million-image cache) and each shard has one file to checksum.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.formats.base import FormatReader
from readers.record import Record

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

    def __init__(self, root: Path, manifest) -> None:
        names: list[bytes] = []
        numbers: list[list[int]] = []
        for shard in manifest.shards:
            header, rows = read_index(root / shard.file)
            if header.get("count") != shard.count or len(rows) != shard.count:
                raise ManifestError(
                    f"{root / shard.file}: lists {len(rows)} files, the manifest says {shard.count}; re-pack"
                )
            names += [os.fsencode(row[0]) for row in rows]
            numbers += [row[1:7] for row in rows]
        table = np.array(numbers, dtype=np.int64).reshape(-1, 6)
        self.labels = table[:, 0].copy()
        self.shapes = table[:, 1:4].copy()
        self.sizes = table[:, 4].copy()
        self.crc = table[:, 5].copy()
        self.ends = np.cumsum([0] + [len(n) for n in names], dtype=np.int64)
        self.names = np.frombuffer(b"".join(names), dtype=np.uint8)
        self.root = os.fsencode(root) + b"/"

    def path(self, index: int) -> bytes:
        return self.root + self.names[self.ends[index] : self.ends[index + 1]].tobytes()


class BmpReader(FormatReader):
    name = "bmp"
    merge_gap = 1  # one file per image: reading the files in a gap would only throw them away

    def __init__(self, root, manifest, verify: bool = False):
        super().__init__(root, manifest, verify)
        self._index: BmpIndex | None = None

    @property
    def index(self) -> BmpIndex:
        return self.handle("index")

    def _open(self, key: str) -> BmpIndex:
        # Parsed once: a forked worker reuses its parent's arrays (shared copy-on-write).
        if self._index is None:
            self._index = BmpIndex(Path(self.root), self.manifest)
        return self._index

    def __getstate__(self):
        state = super().__getstate__()
        state["_index"] = None  # rebuilt on first use; keeps pickled readers small
        return state

    def read(self, index: int) -> Record:
        index = self.check_index(index)
        idx = self.index
        path = idx.path(index)
        try:
            with open(path, "rb", buffering=0) as fh:
                data = fh.readall()
        except FileNotFoundError:
            raise ManifestError(f"{os.fsdecode(path)}: file of the BMP cache is missing; re-pack") from None
        if self.verify and (len(data) != idx.sizes[index] or zlib.crc32(data) & 0xFFFFFFFF != idx.crc[index]):
            raise ChecksumError(
                f"{os.fsdecode(path)}: does not match the checksum in the cache index (corrupt or modified)"
            )
        height, width, channels = idx.shapes[index].tolist()
        return Record(data, int(idx.labels[index]), height, width, channels, "bmp")

    def read_block(self, start: int, stop: int) -> list[Record]:
        # One file per image: there is no single sequential read to make here.
        return [self.read(i) for i in range(start, stop)]

    def labels(self) -> np.ndarray:
        return self.index.labels.copy()
