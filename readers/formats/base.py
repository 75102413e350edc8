"""The reader interface every format implements: record i, block [a, b), labels.

Readers open their files lazily in the process that reads (after a DataLoader fork or spawn),
and drop open handles when pickled, so a reader can be handed to worker processes freely.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from readers.checksums import REMOTE_FIX, check_against_manifest, file_sha256, sha256_of, sha256_of_bytes
from readers.errors import ChecksumError, DatasetReplacedError, ImgpackError, ManifestError, OptionError
from readers.fields import decode, typed
from readers.formats.label_file import LABELS_DTYPE, parse_entry
from readers.manifest import Manifest
from readers.paths import inside
from readers.readahead import Extent
from readers.record import Record
from readers.remote import is_url
from readers.remote_parts import RemoteParts

# Indices closer than this are read as one block and the unused records in between dropped:
# one sequential read beats several small ones.
MERGE_GAP = 8

__all__ = ["FormatReader", "open_shard_file", "sha256_of"]  # sha256_of: re-exported for old imports


def open_shard_file(
    path: str, shard: Any, check_sha: bool, load_index: Callable[[], Any], where: str = ""
) -> tuple[int, Any]:
    """A local shard file opened read-only, checked present, as long as the manifest says and
    (``check_sha``) matching its sha256, with its index from ``load_index()``: ``(fd, index)``.
    The descriptor is closed again if any check fails; errors name ``where`` (default ``path``)."""
    where = where or path
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ManifestError(
            f"{where}: shard listed in the manifest is missing; copy it again or re-pack the dataset"
        ) from None
    try:
        st = os.fstat(fd)
        check_regular(st, where)
        size = st.st_size
        if size < shard.bytes:
            raise ManifestError(
                f"{where}: shard is truncated ({size} of {shard.bytes} bytes); "
                "copy it again or re-pack the dataset"
            )
        if check_sha:
            check_against_manifest(where, file_sha256(path), shard.sha256)
        return fd, load_index()
    except BaseException:
        os.close(fd)
        raise


def read_all(fd: int, size: int) -> bytes:
    """``size`` bytes from the start of ``fd`` (fewer only where the file is shorter)."""
    chunks, got = [], 0
    while got < size:
        chunk = os.pread(fd, size - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def shards_holding(manifest: Manifest, indices: np.ndarray) -> list[int]:
    """Positions (ascending) of the shards of ``manifest`` that hold the samples ``indices``."""
    firsts = np.array([s.first for s in manifest.shards], dtype=np.int64)
    return np.unique(np.searchsorted(firsts, np.asarray(indices, dtype=np.int64), side="right") - 1).tolist()


def dir_identity(root: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_regular(st: os.stat_result, where: str) -> None:
    """A part the manifest lists must be a plain file (a directory in its place is a bad copy)."""
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(
            f"{where}: is a directory or special file, not the data file the manifest lists; "
            "copy that file again or re-pack the dataset"
        )


class FormatReader:
    # Formats where a lookup costs about what a sequential step costs (LMDB) set this to 1.
    merge_gap: ClassVar[int] = MERGE_GAP
    # Datasets packed with an older format_version than this are refused with a re-pack hint.
    oldest_format_version: ClassVar[int] = 1
    # Formats that check a shard only when it is opened (so one damaged shard leaves the others
    # readable) set this; `pack info` then opens each shard once (check_every_part).
    checks_shards_on_open: ClassVar[bool] = False

    def __init__(
        self,
        root: str | os.PathLike,
        manifest: Manifest,
        verify: bool = False,
        cache_dir: str | os.PathLike | None = None,
        cache_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ):
        self.remote = is_url(root)
        if cache_dir is not None and not self.remote:
            raise OptionError(f"{root}: cache_dir is for datasets behind a URL; this one is local")
        self.root: str | Path = root if is_url(root) else Path(root)
        # Behind a URL: parts are fetched through this (see readers.remote_parts).
        self.parts = RemoteParts(str(root), storage_options, cache_dir, cache_size) if self.remote else None
        self.cache_dir = cache_dir
        self.manifest = manifest
        self.verify = verify
        self._handles: dict[Any, Any] = {}
        self._pid = os.getpid()
        self._sha_checked: set[tuple] = set()
        # The directory this reader opened: `pack --force` swaps a new one in under the same path,
        # and a part opened after that must never be paired with this manifest (see handle()).
        self._identity = None if self.remote else dir_identity(self.root)
        self.ahead: Any = None  # during a pass behind a URL: what is fetched ahead (remote_ahead.py)

    def check_parts(self) -> None:
        """Check, cheaply and before any read, that each part holds what the manifest says.

        Called by ``open_reader`` for local datasets; formats override it.
        """

    def check_parts_of(self, positions: Sequence[int]) -> None:
        """``check_parts`` for the shards at ``positions`` only (a view's parent: the parts its
        samples lie in); formats whose check is costly (hashing under ``verify``) override it."""
        self.check_parts()

    def check_every_part(self) -> None:
        """What ``pack info`` checks: ``check_parts``, and, where the format checks shards as it
        opens them, each shard opened once (present, a plain file, as long as the manifest says)."""
        self.check_parts()
        if self.checks_shards_on_open:
            for position in range(len(self.manifest.shards)):
                self._close_handle(self._open_unreplaced(position))

    def checked_parts(self) -> list[tuple[FormatReader, Any]]:
        """(reader, shard) of each part ``pack verify`` checksums: this reader's shards (a view
        lists its parent's shards that hold its samples, readers/views.py)."""
        return [(self, shard) for shard in self.manifest.shards]

    def location(self, name: str) -> str:
        """Where part ``name`` lives, for messages: its URL, or its path in the dataset directory."""
        return self.parts.url(name) if self.parts is not None else str(self.part_path(name))

    def local_file(self, shard: Any) -> str:
        """A local path of the file the manifest checksums for ``shard``: in the dataset directory,
        or (behind a URL) its copy in the part cache, downloaded and checked against the
        manifest's size and sha256 first."""
        if self.parts is None:
            return str(self.checksum_path(shard))
        name, size = self.checksum_name(shard), self.checksum_size(shard)
        path = self.parts.local(name, size, shard.sha256, self.verify)
        if self.verify:  # checked by the cache (once per process): check_sha256 need not hash it again
            st = os.stat(path)
            self._sha_checked.add((os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return str(path)

    def part_path(self, name: str) -> Path:
        """``root / name`` for a name from the manifest or an index, refused if it leaves the dataset."""
        root = self.root
        if not isinstance(root, Path):  # a URL: its parts go through self.parts
            raise TypeError(f"{root}: part_path is for local datasets")
        path = root / name
        inside(root, path, f"{root}: {name}")
        return path

    def describe(self, index: int) -> str:
        """Where global sample ``index`` lives, for error messages: dataset, part and index."""
        shard = self.manifest.shards[self.manifest.shard_of(index)] if self.manifest.shards else None
        part = f", part {shard.file}" if shard is not None else ""
        return f"{self.root}{part}, sample {index}"

    def check_sha256(self, path: str | os.PathLike, expected: str, where: str) -> None:
        """With ``verify``: the file's sha256 must match the manifest; checked once per process.

        Run before a library parses the file, so a corrupt LMDB or HDF5 file is refused instead
        of being mapped or parsed (where a flipped bit can crash the process).
        """
        if not self.verify:
            return
        st = os.stat(path)
        check_regular(st, where)
        key = (os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._sha_checked:
            return
        check_against_manifest(where, file_sha256(path), expected)
        self._sha_checked.add(key)

    @property
    def lowest_label(self) -> int:
        """-1: a sample with no single class (a caption or tags set, a COCO image with several
        categories, a WebDataset sample without ``.cls``), with or without fields."""
        return -1

    def typed_fields(self, record: Record, index: int) -> Record:
        """``record`` with its stored fields decoded to typed values (readers/fields.py)."""
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

    def checksum_name(self, shard: Any) -> str:
        """The name (relative to the root) of the file whose sha256 the manifest records for ``shard``."""
        return shard.file

    def checksum_size(self, shard: Any) -> int | None:
        """The size of that file, as the manifest records it (None where it does not)."""
        return shard.bytes

    def checksum_path(self, shard) -> Path:
        """The file whose sha256 the manifest records for ``shard`` (local datasets)."""
        return self.part_path(self.checksum_name(shard))

    def _open(self, key: Any) -> Any:
        """Open the handle called ``key`` (a shard position, say) in this process."""
        raise NotImplementedError

    def _close_handle(self, handle: Any) -> None:
        close = getattr(handle, "close", None)
        if close is not None:
            close()

    # -- shared machinery ---------------------------------------------------------------------
    def handle(self, key: Any = 0) -> Any:
        if self._pid != os.getpid():  # forked: never use the parent's handles
            self._handles = {}
            self._pid = os.getpid()
        handle = self._handles.get(key)
        if handle is None:
            handle = self._handles[key] = self._open_unreplaced(key)
        return handle

    def _open_unreplaced(self, key: Any) -> Any:
        """``_open(key)``, refused if the dataset directory is no longer the one this reader opened.

        Checked after the open: a part opened before a swap holds the old samples, one opened
        after it is caught here; either way no new file is read with the old manifest."""
        try:
            handle = self._open(key)
        except (ImgpackError, OSError) as exc:  # a part gone or changed, as a replaced dataset's are
            self.check_not_replaced(exc)
            raise
        try:
            self.check_not_replaced()
        except DatasetReplacedError:
            self._close_handle(handle)
            raise
        return handle

    def pin_directory(self, identity: tuple[int, int] | None) -> None:
        """Take ``identity`` (of the directory before its manifest was read) as the dataset's: a
        swap between reading the manifest and opening this reader is refused now, not later."""
        self._identity = identity
        self.check_not_replaced()

    def check_not_replaced(self, cause: BaseException | None = None) -> None:
        """Raise ``DatasetReplacedError`` if the dataset directory was replaced since the open."""
        if self._identity is None or dir_identity(self.root) == self._identity:
            return
        raise DatasetReplacedError(
            f"{self.root}: the dataset was replaced (by `pack --force`, or removed) after this reader "
            "opened it; the parts it had open still give the old samples, the others are gone: "
            "open the dataset again (open_dataset / open_iterable) to read the new one"
        ) from cause

    def check_index(self, index: int) -> int:
        index = int(index)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples in {self.root}")
        return index

    def extents(self, indices: np.ndarray) -> list[Extent] | None:
        """The bytes reading ``indices`` will touch, for read-ahead hints (readers/readahead.py),
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
        in one block (what remote reads plan ahead from, readers/remote_ahead.py)."""
        unique = np.unique(np.asarray(indices, dtype=np.int64))
        if unique.size == 0:
            return []
        cuts = np.flatnonzero(np.diff(unique) > self.merge_gap) + 1
        starts = unique[np.concatenate([[0], cuts])]
        stops = unique[np.concatenate([cuts - 1, [unique.size - 1]])] + 1
        return list(zip(starts.tolist(), stops.tolist()))

    def fetch_ahead(self, planned: list[np.ndarray], settings: Any) -> Any:
        """A context in which reads ``read_many(planned[0])``, ``read_many(planned[1])``... may be
        served from data fetched ahead (remote datasets; readers/remote_ahead.py). Through a
        ``cache_dir``: the parts downloaded ahead, in the order ``planned`` first needs them."""
        from contextlib import nullcontext

        from readers import remote_ahead

        if self.parts is None or not self.manifest.shards:
            return nullcontext()
        if self.cache_dir is None:
            return self.fetch_ranges_ahead(planned, settings)
        return remote_ahead.parts_ahead(self, remote_ahead.part_order(self, planned), settings)

    def fetch_ranges_ahead(self, planned: list[np.ndarray], settings: Any) -> Any:
        """Ranged reads planned ahead, for formats that read remote parts by ranges (tar)."""
        from contextlib import nullcontext

        return nullcontext()

    def close(self) -> None:
        if self._pid == os.getpid():
            for handle in self._handles.values():
                self._close_handle(handle)
        self._handles = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        state["ahead"] = None  # requests in flight belong to the process that made them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
