"""LMDB writer: one environment per part, records appended in batched transactions.

The on-disk layout lives with the reader (readers/formats/lmdb.py); this side only writes it.
"""

from __future__ import annotations

import shutil
from array import array
from collections.abc import Sequence
from pathlib import Path

import lmdb
import numpy as np

from readers.errors import ImgpackError
from readers.formats.lmdb.reader import LABELS_KEY, encode_key, shard_name
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import FormatWriter, PartWriter, disk_hint
from readers.store.checksums import file_sha256
from readers.store.manifest import Shard
from readers.store.record import pack_record

COMMIT_SAMPLES = 512
COMMIT_BYTES = 64 << 20
INITIAL_MAP_SIZE = 256 << 20


class LmdbPartWriter(PartWriter):
    def __init__(self, path: Path):
        self.path = path
        if path.exists():
            shutil.rmtree(path)
        self.map_size = INITIAL_MAP_SIZE
        try:
            self.env = self._open_env()
        except lmdb.Error as exc:
            raise ImgpackError(
                f"{path}: cannot create the LMDB environment ({exc}); {disk_hint(path)}"
            ) from None
        self.pending: list[tuple[bytes, bytes]] = []
        self.pending_bytes = 0
        self.labels = array("i")  # int32, 4 bytes a sample (a part can hold millions)

    def _open_env(self) -> lmdb.Environment:
        return lmdb.open(
            str(self.path),
            map_size=self.map_size,
            subdir=True,
            lock=False,
            sync=False,
            metasync=False,
            meminit=True,
            max_dbs=0,
        )

    def add(self, sample: PackedSample) -> None:
        key = encode_key(len(self.labels))
        value = pack_record(
            sample.data, sample.label, sample.height, sample.width, sample.channels, sample.encoding,
            sample.fields.encode(),
        )
        self.pending.append((key, value))
        self.pending_bytes += len(value)
        self.labels.append(sample.label)
        if len(self.pending) >= COMMIT_SAMPLES or self.pending_bytes >= COMMIT_BYTES:
            self._commit()

    def _commit(self, extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
        items = self.pending + list(extra)
        while True:
            try:
                with self.env.begin(write=True) as txn, txn.cursor() as cursor:
                    cursor.putmulti(items, append=True)
                break
            except lmdb.MapFullError:
                # Grow geometrically; the file on disk only holds the pages actually written.
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)
        self.pending = []
        self.pending_bytes = 0

    def close(self) -> list[Shard]:
        labels = np.frombuffer(self.labels, dtype=np.int32).astype("<i4").tobytes()
        try:
            self._commit(extra=[(LABELS_KEY, labels)])
            self.env.sync(True)
        except lmdb.Error as exc:
            raise ImgpackError(
                f"{self.path}: cannot write the LMDB environment ({exc}); {disk_hint(self.path)}"
            ) from None
        finally:
            self.env.close()
        data = self.path / "data.mdb"
        return [Shard(self.path.name, 0, len(self.labels), data.stat().st_size, file_sha256(data))]

    def abort(self) -> None:
        try:
            self.env.close()
        except lmdb.Error:
            pass
        shutil.rmtree(self.path, ignore_errors=True)


class LmdbWriter(FormatWriter):

    def open_part(self, part: int) -> LmdbPartWriter:
        return LmdbPartWriter(self.out / shard_name(part))

    def part_files(self, part: int) -> list[Path]:
        return [self.out / shard_name(part)]
