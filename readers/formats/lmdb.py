"""LMDB datasets: one or more environments ``data-000000.lmdb/`` holding samples by global index.

On-disk layout (shared with the writer in packer/formats/lmdb.py):
- key: the sample's index inside its environment (global index minus the shard's ``first``) as
  8 bytes big-endian, so a cursor walk is a sequential read and shards can be written
  independently (by parallel or Ray tasks) before their place in the dataset is known;
- value: ``readers.record.HEADER`` (label, encoding, shape, CRC32) followed by the image bytes;
- ``meta/labels``: every label of the environment as little-endian int32, for fast label scans.
"""

from __future__ import annotations

import functools
import os
import struct

import lmdb
import numpy as np

from readers.errors import ManifestError
from readers.formats.base import FormatReader
from readers.record import Record, unpack_record

KEY = struct.Struct(">Q")
LABELS_KEY = b"meta/labels"


# py-lmdb refuses to open one environment twice in a process, and a forked DataLoader worker
# inherits its parent's open environments. So environments are shared per process (keyed by the
# data file's identity, so a re-packed path is a new environment), and a child closes the ones
# it inherited (safe: they are opened with lock=False, there are no locks to release) before
# opening its own.
_ENVS: dict[tuple, lmdb.Environment] = {}
_ENVS_PID = os.getpid()


def shared_env(path: str) -> lmdb.Environment:
    global _ENVS_PID
    if _ENVS_PID != os.getpid():
        for env in _ENVS.values():
            try:
                env.close()
            except lmdb.Error:
                pass
        _ENVS.clear()
        _ENVS_PID = os.getpid()
    st = os.stat(os.path.join(path, "data.mdb"))
    key = (os.path.realpath(path), st.st_dev, st.st_ino)
    env = _ENVS.get(key)
    if env is None:
        env = _ENVS[key] = lmdb.open(
            path, readonly=True, lock=False, readahead=False, meminit=False, max_readers=2048
        )
    return env


def shard_name(position: int) -> str:
    return f"data-{position:06d}.lmdb"


def encode_key(index: int) -> bytes:
    return KEY.pack(index)


class LmdbReader(FormatReader):
    name = "lmdb"
    merge_gap = 1  # B-tree lookups in a memory map: reading the records in between buys nothing

    def checksum_path(self, shard):
        return self.root / shard.file / "data.mdb"

    def _open(self, shard: int):
        path = self.root / self.manifest.shards[shard].file
        if not path.exists():
            raise ManifestError(f"{path}: LMDB environment listed in the manifest is missing")
        env = shared_env(str(path))
        # One long read transaction per environment and process: values come back as zero-copy
        # memoryviews into the memory map and stay valid while it is open.
        return env, env.begin(buffers=True)

    def _close_handle(self, handle) -> None:
        _, txn = handle
        try:
            txn.abort()
        except lmdb.Error:
            pass

    def _where(self, index: int) -> str:
        return f"{self.root}: sample {index}"

    def read_local(self, shard: int, start: int, stop: int) -> list[Record]:
        first = self.manifest.shards[shard].first
        _, txn = self.handle(shard)
        if stop - start == 1:  # a lookup is cheaper than setting up a cursor
            value = txn.get(encode_key(start))
            if value is None:
                raise ManifestError(
                    f"{self._where(first + start)} is missing from the LMDB data; re-pack the dataset"
                )
            return [unpack_record(value, self.verify, lambda: self._where(first + start))]
        records: list[Record] = []
        with txn.cursor() as cursor:
            if not cursor.set_key(encode_key(start)):
                raise ManifestError(f"{self._where(first + start)} is missing from the LMDB data")
            for key, value in cursor:
                local = KEY.unpack(key)[0] if len(key) == KEY.size else -1
                if local >= stop or local < 0:
                    break
                records.append(
                    unpack_record(value, self.verify, functools.partial(self._where, first + local))
                )
        if len(records) != stop - start:
            raise ManifestError(
                f"{self.root}: samples {first + start}..{first + stop - 1} are incomplete in the LMDB data"
            )
        return records

    def labels(self) -> np.ndarray:
        parts = []
        for shard in range(len(self.manifest.shards)):
            _, txn = self.handle(shard)
            raw = txn.get(LABELS_KEY)
            if raw is None:
                return super().labels()
            parts.append(np.frombuffer(raw, dtype="<i4"))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
