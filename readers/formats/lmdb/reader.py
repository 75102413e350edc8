"""LMDB datasets: one or more environments ``data-000000.lmdb/`` holding samples by global index.

On-disk layout (shared with writer.py beside it):
- key: the sample's index inside its environment (global index minus the shard's ``first``) as
  8 bytes big-endian, so a cursor walk is a sequential read and shards can be written
  independently (by parallel or Ray tasks) before their place in the dataset is known;
- value: ``readers.store.record.HEADER`` (label, encoding, shape, CRC32) followed by the image bytes;
- ``meta/labels``: every label of the environment as little-endian int32, for fast label scans.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import lmdb
import numpy as np

from readers.errors import ImgpackError, ManifestError
from readers.formats.base import FormatReader
from readers.formats.lmdb._pages import PageTable
from readers.remote.readahead import Extent, open_parts
from readers.store.record import Record, unpack_record

KEY = struct.Struct(">Q")
LABELS_KEY = b"meta/labels"

# The two meta pages at the start of data.mdb (LMDB's MDB_meta after a 16-byte page header):
# magic and version, then the free and main databases (48 bytes each; the free one's first
# field is the page size), then the last page number in use and the transaction id.
META_MAGIC = 0xBEEFC0DE
META_HEAD = struct.Struct("<II")  # at 16: magic, version
META_PSIZE = struct.Struct("<I")  # at 40
META_ENTRIES = struct.Struct("<Q")  # at 120: main database entries
META_TAIL = struct.Struct("<QQ")  # at 136: last page, txnid
META_END = 152


def env_extent(data_mdb: str, where: str) -> tuple[int, int]:
    """(bytes the newest meta page says data.mdb holds, main database entries), from its header.

    Mapping a file shorter than what LMDB will touch kills the process with SIGBUS, so this
    is checked before ``lmdb.open``.
    """
    with open(data_mdb, "rb") as fh:
        head = fh.read(META_END)
        if len(head) < META_END or META_HEAD.unpack_from(head, 16)[0] != META_MAGIC:
            raise ManifestError(f"{where}: not an LMDB data file (bad header); re-pack the dataset")
        psize = META_PSIZE.unpack_from(head, 40)[0]
        if psize < 512 or psize & (psize - 1) or psize > 1 << 16:
            raise ManifestError(f"{where}: LMDB header holds page size {psize}; the file is corrupt, re-pack")
        fh.seek(psize)
        second = fh.read(META_END)
    metas = [head] + ([second] if len(second) == META_END else [])
    metas = [m for m in metas if META_HEAD.unpack_from(m, 16)[0] == META_MAGIC]
    newest = max(metas, key=lambda m: META_TAIL.unpack_from(m, 136)[1])
    last_page, _ = META_TAIL.unpack_from(newest, 136)
    return (last_page + 1) * psize, META_ENTRIES.unpack_from(newest, 120)[0]


# py-lmdb refuses to open one environment twice in a process, and a forked DataLoader worker
# inherits its parent's open environments. So environments are shared per process (keyed by the
# data file's identity, so a re-packed path is a new environment), and a child closes the ones
# it inherited (safe: they are opened with lock=False, there are no locks to release) before
# opening its own.
_ENVS: dict[tuple, lmdb.Environment] = {}
_ENVS_PID = os.getpid()


def shared_env(data_file: str) -> lmdb.Environment:
    """The read-only environment whose data file is ``data_file`` (an environment's ``data.mdb``,
    or a part's copy in the remote cache), opened once per process."""
    global _ENVS_PID
    if _ENVS_PID != os.getpid():
        for stale in _ENVS.values():
            try:
                stale.close()
            except lmdb.Error:
                pass
        _ENVS.clear()
        _ENVS_PID = os.getpid()
    st = os.stat(data_file)
    key = (os.path.realpath(data_file), st.st_dev, st.st_ino)
    env = _ENVS.get(key)
    if env is None:
        env = _ENVS[key] = lmdb.open(
            data_file,
            subdir=False,  # the data file itself: no lock file (lock=False) is needed next to it
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=2048,
        )
    return env


def shard_name(position: int) -> str:
    return f"data-{position:06d}.lmdb"


def encode_key(index: int) -> bytes:
    return KEY.pack(index)


class OpenEnv:
    """One environment in this process: its read transaction, and for read-ahead a descriptor
    of the same data.mdb (opened with it) and the page table, built on the first hint."""

    def __init__(self, env: lmdb.Environment, path: str, count: int):
        self.txn = env.begin(buffers=True)
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.path = path
        self.count = count
        self.pages: PageTable | None = None
        self.pages_failed = False

    def page_table(self) -> PageTable | None:
        """The page table (None where data.mdb's tree cannot be walked: no hints, reads as before)."""
        if self.pages is None and not self.pages_failed:
            try:
                self.pages = PageTable(self.fd, self.count, self.path)
            except (ImgpackError, OSError, struct.error):
                self.pages_failed = True
        return self.pages

    def close(self) -> None:
        try:
            self.txn.abort()
        except lmdb.Error:
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LmdbReader(FormatReader):
    merge_gap = 1  # B-tree lookups in a memory map: reading the records in between buys nothing
    oldest_format_version = 2  # record checksums cover the header since format_version 2

    def checksum_name(self, shard) -> str:
        return shard.file + "/data.mdb"

    def check_parts(self) -> None:
        for shard in self.manifest.shards:
            self._check_env(shard)

    def _check_env(self, shard) -> str:
        """The data.mdb of ``shard`` (local, or downloaded into the cache), checked against the manifest."""
        path = Path(self.local_file(shard))
        data = self.location(self.checksum_name(shard))  # for messages: the path or the URL
        if not path.is_file():
            raise ManifestError(f"{data}: LMDB environment listed in the manifest is missing; re-pack")
        size = path.stat().st_size
        if size != shard.bytes:
            raise ManifestError(
                f"{data}: holds {size} bytes, the manifest says {shard.bytes} (truncated or replaced); "
                "copy it again or re-pack the dataset"
            )
        needed, entries = env_extent(str(path), data)
        if needed > size:
            raise ManifestError(f"{data}: truncated, LMDB needs {needed} bytes, the file has {size}; re-pack")
        if entries != shard.count + 1:  # the samples and meta/labels
            raise ManifestError(
                f"{data}: holds {max(0, entries - 1)} samples, the manifest says {shard.count}; "
                "the manifest or the data is corrupt, re-pack the dataset"
            )
        return str(path)

    def _open(self, shard: int):
        entry = self.manifest.shards[shard]
        path = self._check_env(entry)
        self.check_sha256(path, entry.sha256, self.location(self.checksum_name(entry)))
        # One long read transaction per environment and process: values come back as zero-copy
        # memoryviews into the memory map and stay valid while it is open.
        return OpenEnv(shared_env(path), path, entry.count)

    def _close_handle(self, handle) -> None:
        handle.close()

    def extents(self, indices) -> list[Extent] | None:
        parts = open_parts(self, indices)
        if parts is None:
            return None
        out: list[Extent] = []
        for _, opened, local in parts:
            table = opened.page_table()
            if table is not None:
                out.append(Extent(opened.fd, *table.extents(local)))
        return out

    def _where(self, index: int) -> str:
        return self.describe(index)

    def read_local(self, shard: int, start: int, stop: int) -> list[Record]:
        first = self.manifest.shards[shard].first
        txn = self.handle(shard).txn
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

    def read_many(self, indices) -> list[Record]:
        """Records for ``indices`` (any order, repeats allowed): one ``getmulti`` per environment,
        so a shuffled batch costs one C loop of B-tree lookups, not a Python call per record."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        if idx.min() < 0 or idx.max() >= len(self):
            bad = idx[(idx < 0) | (idx >= len(self))][0]
            raise IndexError(f"sample index {bad} out of range for {len(self)} samples in {self.root}")
        firsts = np.array([s.first for s in self.manifest.shards], dtype=np.int64)
        shards = np.searchsorted(firsts, idx, side="right") - 1
        records: list[Record | None] = [None] * idx.size
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            first = int(firsts[shard])
            local = (idx[where] - first).astype(">u8").tobytes()
            keys = [local[k : k + KEY.size] for k in range(0, len(local), KEY.size)]
            txn = self.handle(shard).txn
            with txn.cursor() as cursor:
                values = cursor.getmulti(keys)
            if len(values) != len(keys):  # getmulti leaves out missing keys: name the first one
                found = {bytes(k) for k, _ in values}
                missing = next(first + KEY.unpack(k)[0] for k in keys if k not in found)
                raise ManifestError(
                    f"{self._where(missing)} is missing from the LMDB data; re-pack the dataset"
                )
            for position, (key, value) in zip(where.tolist(), values):
                index = first + KEY.unpack(key)[0]
                record = unpack_record(value, self.verify, functools.partial(self._where, index))
                records[position] = self.typed_fields(record, index) if self.manifest.fields else record
        got: list[Record] = records  # type: ignore[assignment]  # every position was filled above
        labels = [r.label for r in got]
        if min(labels) < self.lowest_label or max(labels) >= len(self.manifest.classes):
            self.check_labels(labels, str(self.root))
        return got

    def labels(self) -> np.ndarray:
        parts = []
        for shard in range(len(self.manifest.shards)):
            txn = self.handle(shard).txn
            raw = txn.get(LABELS_KEY)
            if raw is None:
                return super().labels()
            parts.append(np.frombuffer(raw, dtype="<i4"))
        labels = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        if len(labels) != len(self):
            raise ManifestError(f"{self.root}: meta/labels has {len(labels)} labels for {len(self)} samples")
        self.check_labels(labels, f"{self.root}: meta/labels")
        return labels
