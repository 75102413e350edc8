"""A format defined outside imgpack, for the contract suite
(tests/readers/formats/test_out_of_tree_format.py).

One ``npy-000000.npz`` file per part, written with plain numpy and read back with
``np.load(allow_pickle=False)``: ``images`` (every sample's bytes, one flat uint8 array) and
``index`` (int64 rows: offset, size, label, height, width, channels, encoding code). The whole
format is this module plus its ``FORMAT`` registered by name; nothing in imgpack knows it.
A pack in a subprocess sees it through ``IMGPACK_FORMATS=tests.support.npyformat:FORMAT``.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.formats.base import FormatReader
from readers.formats.format import Format
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import FormatWriter, PartWriter
from readers.store.checksums import file_sha256
from readers.store.manifest import Shard
from readers.store.record import ENCODING_CODES, ENCODING_NAMES, Record

PLUGIN = "tests.support.npyformat:FORMAT"


def part_name(part: int) -> str:
    return f"npy-{part:06d}.npz"


class NpyPartWriter(PartWriter):
    def __init__(self, path: Path):
        self.path = path
        self.images = bytearray()
        self.index: list[tuple[int, ...]] = []

    def add(self, sample: PackedSample) -> None:
        shape = (sample.label, sample.height, sample.width, sample.channels)
        self.index.append((len(self.images), len(sample.data), *shape, ENCODING_CODES[sample.encoding]))
        self.images += sample.data

    def close(self) -> list[Shard]:
        with open(self.path, "wb") as fh:
            images = np.frombuffer(bytes(self.images), np.uint8)
            np.savez(fh, images=images, index=np.asarray(self.index, np.int64).reshape(-1, 7))
        return [Shard(self.path.name, 0, len(self.index), self.path.stat().st_size, file_sha256(self.path))]

    def abort(self) -> None:
        self.path.unlink(missing_ok=True)


class NpyWriter(FormatWriter):

    def open_part(self, part: int) -> NpyPartWriter:
        return NpyPartWriter(self.out / part_name(part))

    def part_files(self, part: int) -> list[Path]:
        return [self.out / part_name(part)]


class NpyReader(FormatReader):

    def check_parts(self) -> None:
        for entry in self.manifest.shards:
            path = self.part_path(entry.file)
            if not path.is_file() or path.stat().st_size < entry.bytes:
                raise ManifestError(f"{path}: missing or shorter than the manifest says; re-pack the dataset")

    def _open(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        entry = self.manifest.shards[shard]
        path, where = self.local_file(entry), self.location(entry.file)
        self.check_sha256(path, entry.sha256, where)
        try:
            with np.load(path, allow_pickle=False) as archive:
                images, index = archive["images"], archive["index"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise ChecksumError(f"{where}: cannot be read ({exc}); the file is corrupt, re-pack it") from None
        if index.shape != (entry.count, 7):
            raise ManifestError(f"{where}: holds {len(index)} samples but the manifest says {entry.count}")
        return images, index

    def read_local(self, shard: int, start: int, stop: int) -> list[Record]:
        images, index = self.handle(shard)
        records = []
        for offset, size, label, height, width, channels, code in index[start:stop].tolist():
            data = memoryview(images[offset : offset + size])
            records.append(Record(data, label, height, width, channels, ENCODING_NAMES[code]))
        return records


FORMAT = Format(
    name="npy",
    reader=NpyReader,
    writer=NpyWriter,
    files=re.compile(r"npy-\d{6}\.npz"),
    remote_finish="as-is",
)
