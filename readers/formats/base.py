"""The reader interface every format implements: record i, block [a, b), labels.

What is read and checked record by record lives here; the dataset's part files (opened lazily
in the process that reads, checked against the manifest, dropped when pickled) are the base
class's, readers/formats/part_files.py. The writer's interface is readers/formats/writer_base.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.fields.field_schema import decode, typed
from readers.formats.label_file import LABELS_DTYPE, parse_entry
from readers.formats.part_files import PartFiles, check_regular, read_all
from readers.remote.readahead import Extent
from readers.store.checksums import REMOTE_FIX, check_against_manifest, sha256_of_bytes
from readers.store.record import Record

# Indices closer than this are read as one block and the unused records in between dropped:
# one sequential read beats several small ones.
MERGE_GAP = 8


class FormatReader(PartFiles):
    # Formats where a lookup costs about what a sequential step costs (LMDB) set this to 1.
    merge_gap: ClassVar[int] = MERGE_GAP
    # Datasets packed with an older format_version than this are refused with a re-pack hint.
    oldest_format_version: ClassVar[int] = 1

    @property
    def lowest_label(self) -> int:
        """-1: a sample with no single class (a caption or tags set, a COCO image with several
        categories, a WebDataset sample without ``.cls``), with or without fields."""
        return -1

    def typed_fields(self, record: Record, index: int) -> Record:
        """``record`` with its stored fields decoded to typed values (readers/fields/field_schema.py)."""
        stored = record.fields
        if isinstance(stored, dict):
            return record._replace(fields=typed(self.manifest.fields, stored))
        raw = b"" if stored is None else stored
        return record._replace(fields=decode(self.manifest.fields, raw, self.describe(index)))

    def check_labels(self, labels: Sequence[int] | np.ndarray, where: str) -> None:
        """Every label must index the manifest's classes (or be -1: no single class)."""
        if len(labels) == 0:
            return
        low, high = int(np.min(labels)), int(np.max(labels))
        if low < self.lowest_label or high >= len(self.manifest.classes):
            bad = low if low < self.lowest_label else high
            raise ManifestError(
                f"{where}: label {bad} is outside the {len(self.manifest.classes)} classes of the "
                "manifest; the dataset is corrupt, re-pack it"
            )

    def __len__(self) -> int:
        return self.manifest.num_samples

    # -- to implement: read_local (sharded formats) or read_block ------------------------------
    def read_local(self, shard: int, start: int, stop: int) -> list[Record]:
        """Records at positions start..stop-1 *inside* shard ``shard``, in one sequential read."""
        raise NotImplementedError

    def read(self, index: int) -> Record:
        index = self.check_index(index)
        return self.read_block(index, index + 1)[0]

    def read_block(self, start: int, stop: int) -> list[Record]:
        """Records start..stop-1 (global indices), one ``read_local`` per shard they span."""
        records: list[Record] = []
        index = start
        while index < stop:
            shard = self.manifest.shard_of(index)
            entry = self.manifest.shards[shard]
            end = min(stop, entry.stop)
            got = self.read_local(shard, index - entry.first, end - entry.first)
            labels = [r.label for r in got]
            if labels and (min(labels) < self.lowest_label or max(labels) >= len(self.manifest.classes)):
                self.check_labels(labels, self.describe(index))
            if self.verify:
                self.check_stored_labels(got, index)
            if self.manifest.fields:
                got = [self.typed_fields(r, index + k) for k, r in enumerate(got)]
            records += got
            index = end
        return records

    def labels(self) -> np.ndarray:
        """Every sample's label (int64): from the format's label file or (older packs) the
        manifest's ``label_runs`` where the writer stored them, else read record by record."""
        stored = self.stored_labels()
        if stored is not None:
            return stored
        cached = self.__dict__.get("_label_array")
        if cached is None:
            cached = np.fromiter((self.read(i).label for i in range(len(self))), np.int64, count=len(self))
            self._label_array = cached
        return cached

    def stored_labels(self) -> np.ndarray | None:
        """The labels the writer stored apart from the records: the label file named by the
        manifest's ``extra.labels`` (tar, tfrecord), or its ``extra.label_runs`` ([label, count]
        pairs, packs of imgpack before the label file); None where neither is recorded."""
        cached = self.__dict__.get("_stored_labels")
        if cached is not None:
            return cached
        extra = self.manifest.extra
        if "labels" in extra:
            labels = self._file_labels(extra["labels"])
        elif "label_runs" in extra:
            labels = self._run_labels(extra["label_runs"])
        else:
            return None
        self._stored_labels = labels
        return labels

    def check_stored_labels(self, records: list[Record], start: int) -> None:
        """With ``verify``: the records' labels must be those stored apart (the label file)."""
        stored = self.stored_labels()
        if stored is None:
            return
        for index, record in enumerate(records, start):
            if record.label != stored[index]:
                raise ChecksumError(
                    f"{self.describe(index)}: label {record.label} in the record but {int(stored[index])} "
                    "in the label file, although both match their checksums (one was modified and "
                    "resealed); re-pack the dataset"
                )

    def _file_labels(self, entry: Any) -> np.ndarray:
        """Labels from the label file (readers/formats/label_file.py): its size always checked,
        its sha256 with ``verify``, its values against the classes."""
        name, size, sha = parse_entry(entry, len(self), f"{self.root}: manifest field 'extra.labels'")
        where = self.location(name)
        if self.parts is not None:
            data = self.parts.read(name)
            if len(data) != size or self.verify:
                check_against_manifest(where, sha256_of_bytes(data), sha, len(data), size, REMOTE_FIX)
            labels = np.frombuffer(data, dtype=LABELS_DTYPE)
        else:
            labels = self._local_file_labels(self.part_path(name), size, sha, where)
        labels = labels.astype(np.int64)  # native order, writable, whatever the file's
        self.check_labels(labels, where)
        return labels

    def _local_file_labels(self, path: Path, size: int, sha: str, where: str) -> np.ndarray:
        """The label file at ``path``, read through one descriptor opened while the dataset
        directory is still the one this reader opened (after `pack --force` the path names the
        new dataset's file: its labels must never be paired with this reader's samples)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in its place must not block
        except FileNotFoundError as exc:
            self.check_not_replaced(exc)
            raise ManifestError(
                f"{where}: label file listed in the manifest is missing; copy it again, or "
                f"rebuild it with `pack reindex {self.root}`"
            ) from None
        try:
            self.check_not_replaced()
            st = os.fstat(fd)
            check_regular(st, where)
            if st.st_size != size:
                check_against_manifest(where, "", sha, st.st_size, size)
            data = read_all(fd, size)
        finally:
            os.close(fd)
        if self.verify:
            check_against_manifest(where, sha256_of_bytes(data), sha)
        return np.frombuffer(data, dtype=LABELS_DTYPE)

    def _run_labels(self, runs: Any) -> np.ndarray:
        """Labels from the manifest's ``extra.label_runs`` ([label, count] pairs), checked."""
        where = f"{self.root}: manifest field 'extra.label_runs'"
        try:
            table = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        except (TypeError, ValueError, OverflowError):
            raise ManifestError(f"{where} is not a list of [label, count] pairs; re-pack") from None
        if (table[:, 1] < 0).any() or int(table[:, 1].sum()) != len(self):
            raise ManifestError(f"{where} does not count {len(self)} samples; re-pack the dataset")
        self.check_labels(table[:, 0], where)
        return np.repeat(table[:, 0], table[:, 1])

    def check_index(self, index: int) -> int:
        index = int(index)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples in {self.root}")
        return index

    def extents(self, indices: np.ndarray) -> list[Extent] | None:
        """The bytes reading ``indices`` will touch, for read-ahead hints (readers/remote/readahead.py),
        or None while a part they lie in is not open in this process (a hint never opens one).
        A format without them (this default) is read unhinted."""
        return []

    def read_many(self, indices: Sequence[int] | np.ndarray) -> list[Record]:
        """Records for ``indices`` (in that order), read as a few sequential blocks."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        found: dict[int, Record] = {}
        for start, stop in self.block_runs(idx):
            for offset, record in enumerate(self.read_block(start, stop)):
                found[start + offset] = record
        wanted = set(np.unique(idx).tolist())
        for k in [k for k in found if k not in wanted]:
            del found[k]
        return [found[i] for i in idx.tolist()]

    def block_runs(self, indices: Sequence[int] | np.ndarray) -> list[tuple[int, int]]:
        """The blocks [start, stop) ``read_many(indices)`` reads: indices closer than ``merge_gap``
        in one block (what remote reads plan ahead from, readers/remote/remote_ahead.py)."""
        unique = np.unique(np.asarray(indices, dtype=np.int64))
        if unique.size == 0:
            return []
        cuts = np.flatnonzero(np.diff(unique) > self.merge_gap) + 1
        starts = unique[np.concatenate([[0], cuts])]
        stops = unique[np.concatenate([cuts - 1, [unique.size - 1]])] + 1
        return list(zip(starts.tolist(), stops.tolist()))

    def fetch_ahead(self, planned: list[np.ndarray], settings: Any, rank: Any = None) -> Any:
        """A context in which reads ``read_many(planned[0])``, ``read_many(planned[1])``... may be
        served from data fetched ahead (remote datasets; readers/remote/remote_ahead.py). Through a
        ``cache_dir``: the parts downloaded ahead, in the order ``planned`` first needs them.
        ``rank``: what every DataLoader worker of the rank reads (a ``RankPlan``), so that ranged
        reads fetched by one are shared with the others."""
        from contextlib import nullcontext

        from readers.remote import remote_ahead

        if self.parts is None or not self.manifest.shards:
            return nullcontext()
        if self.cache_dir is None:
            return self.fetch_ranges_ahead(planned, settings, rank)
        return remote_ahead.parts_ahead(self, remote_ahead.part_order(self, planned), settings)

    def prime_ahead(self, rank: Any, settings: Any) -> list[Any]:
        """What the rank's main process fetches while its DataLoader workers start a pass that
        reads ``rank`` (a ``RankPlan``) from this reader by ranged requests: jobs to run on its
        helper threads (readers/remote/prime.py); none for parts read whole through a cache: a
        worker starts downloading them as soon as it starts."""
        if self.parts is None or self.cache_dir is not None or not self.manifest.shards:
            return []
        return self.prime_ranges(rank, settings)

    def prime_ranges(self, rank: Any, settings: Any) -> list[Any]:
        """``prime_ahead`` for formats that read remote parts by ranges (tar)."""
        return []

    def fetch_ranges_ahead(self, planned: list[np.ndarray], settings: Any, rank: Any = None) -> Any:
        """Ranged reads planned ahead, for formats that read remote parts by ranges (tar)."""
        from contextlib import nullcontext

        return nullcontext()
