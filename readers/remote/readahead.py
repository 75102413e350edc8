"""Reading ahead: ask the kernel for the bytes of the next groups of records before they are read.

The order of an epoch is known before its first read (``readers.order.epoch_order``), so a reading process
can tell the page cache which byte ranges its next groups will touch (``posix_fadvise(...,
POSIX_FADV_WILLNEED)``): the reads are then queued together, at the disk's depth, instead of one
page fault or one ``pread`` at a time when the pack is not cached. A hint changes nothing that is
read: the records still come from the format reader's own reads, so the order, the pixels and the
resume state are the same with or without it.

Each format reader says where records live (``FormatReader.extents``): byte ranges of files it
keeps open, or files to open (one file per image). Ranges are rounded out to aligned ``PIECE``
pieces and merged; the pieces hinted for groups not read yet are bounded by a byte budget
(``readahead=`` read option, else ``IMGPACK_READAHEAD_BYTES``, else ``DEFAULT_BUDGET``; 0 turns it
off), and a piece hinted lately is not hinted again. The hints are made by a few background
threads, so a hint that waits for the device's queue or a cold inode never stalls the reader.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from readers.errors import ImgpackError, OptionError
from readers.process import ProcessPool

PIECE = 256 << 10
PAGE = 4096
DEFAULT_BUDGET = 16 << 20
ENV = "IMGPACK_READAHEAD_BYTES"
# Groups hinted ahead at most, whatever the budget: far-ahead hints of cached data buy nothing.
MAX_GROUPS_AHEAD = 64
# Pieces remembered as hinted, in budgets: a block's pieces serve the many batches its shuffle
# window spreads it over, and hinting them again for each would only use up the budget.
RECENT_BUDGETS = 8
# Threads making hints: opening a cold file (one per image) waits for its inode, so several.
HINT_THREADS = 8

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class Extent(NamedTuple):
    """Bytes a read will touch: ``[offset, offset + length)`` of ``file``, a descriptor its reader
    keeps open (``offset`` and ``length`` may be arrays: several ranges of it, in the order they
    are read), or a function that opens the file (the descriptor is closed after the hint; then
    ``name`` identifies the file and the whole file is hinted)."""

    file: int | Callable[[], int]
    offset: int | np.ndarray
    length: int | np.ndarray
    name: Hashable = None


def spans(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Every integer of each ``[first[i], last[i]]`` in turn (int64)."""
    counts = np.maximum(last - first + 1, 0)
    starts = np.repeat(first, counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + within


def open_parts(reader: Any, indices: Any) -> list[tuple[int, Any, Any]] | None:
    """(shard position, open handle, local indices) for each shard of the records
    ``reader.read_many(indices)`` reads (the records in the gaps of its blocks too: they are read
    with them), or None where ``reader`` has not opened one of them in this process yet: a hint
    never opens a part, so a part's first real open still checks that the dataset was not replaced
    (``FormatReader._open_unreplaced``)."""
    if reader._pid != os.getpid() or not reader._handles:
        return None
    runs = np.array(reader.block_runs(indices), dtype=np.int64).reshape(-1, 2)
    idx = spans(runs[:, 0], runs[:, 1] - 1)
    firsts = np.array([s.first for s in reader.manifest.shards], dtype=np.int64)
    shards = np.searchsorted(firsts, idx, side="right") - 1
    out = []
    for shard in dict.fromkeys(shards.tolist()):
        handle = reader._handles.get(shard)
        if handle is None:
            return None
        out.append((shard, handle, idx[shards == shard] - firsts[shard]))
    return out


def planned_extents(
    stream: Any, epoch: int, positions: Any, group: list[tuple[int, int]]
) -> list[Extent] | None:
    """The extents a ``RecordStream``'s ``_emit(positions, group)`` of ``epoch`` will read (None:
    a part they lie in is not open yet)."""
    out: list[Extent] = []
    for reader, indices in stream.planned_reads(epoch, stream.group_positions(epoch, positions, group)):
        got = reader.extents(indices)
        if got is None:
            return None
        out += got
    return out


def parse_bytes(value: Any, where: str) -> int:
    """A byte count from an int or a text like ``16M``, ``256KiB``, ``0``."""
    if isinstance(value, bool):
        raise OptionError(f"{where}={value!r}: give a byte count such as 16777216 or '16M' (0: off)")
    if isinstance(value, int):
        if value < 0:
            raise OptionError(f"{where}={value}: give 0 (off) or a positive byte count")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise OptionError(f"{where}={value!r}: give a byte count such as 16777216 or '16M' (0: off)")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _UNITS[unit]


def resolve_budget(value: Any) -> int:
    """The read-ahead budget in bytes: ``value`` (the ``readahead=`` option), else the
    environment's ``IMGPACK_READAHEAD_BYTES``, else ``DEFAULT_BUDGET``."""
    if value is not None:
        return parse_bytes(value, "readahead")
    env = os.environ.get(ENV)
    if env is None or not env.strip():
        return DEFAULT_BUDGET
    return parse_bytes(env, ENV)


def advise(fd: int, offset: int, length: int) -> None:
    """The one system call this module makes (tests count them)."""
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


def take_over(fd: int) -> None:
    """Turn the kernel's own readahead off for ``fd`` (``POSIX_FADV_RANDOM``): the hints say what
    will be read. Left on, a read of a shuffled order near pages read lately looks sequential to
    the kernel, which then reads up to ``read_ahead_kb`` (often megabytes) past it: pages of other
    shuffle windows, evicted again before their turn where memory is short (a container's limit),
    so the disk reads the pack several times over (measured: 2.7x its bytes under a 430 MiB cap)."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def _hint_file(open_file: Callable[[], int]) -> None:
    fd = open_file()
    try:
        advise(fd, 0, 0)
    finally:
        os.close(fd)


def _advise_all(ranges: list[tuple[int, int, int]]) -> None:
    for fd, offset, length in ranges:
        _quietly(advise, fd, offset, length)


def _quietly(job: Callable[..., None], *args: Any) -> None:
    # A hint that fails (a file gone, a dataset replaced) is the real read's to report.
    try:
        job(*args)
    except (OSError, ImgpackError):
        pass


Piece = tuple[tuple[Any, Any], Any, int]  # (key: (fd, piece number) or ("file", name), target, bytes)


class ReadAhead:
    """One process's window of hints over the groups of a pass (``on_group`` before each group).

    ``plan(g)`` gives the extents group ``g`` reads. ``threads=0`` hints in the calling thread.
    Figures for tests and benchmarks: ``hinted_bytes`` (all hints), ``peak_ahead`` (the most bytes
    hinted for groups not read yet at any moment)."""

    def __init__(self, budget: int, piece: int = PIECE, threads: int = HINT_THREADS):
        self.piece = piece
        self.budget = max(budget, piece) if budget > 0 else 0  # bytes; at least one piece when on
        self.threads = threads
        self.hinted_bytes = 0
        self.peak_ahead = 0
        self._reset(None)
        self._pool = ProcessPool(threads, "imgpack-readahead")
        self._taken: set[tuple[int, int, int, int]] = set()  # files whose kernel readahead is off

    def _reset(self, token: Any) -> None:
        self._token = token
        self._next = 0
        self._ahead: deque[tuple[int, int]] = deque()  # (group, pieces hinted for it)
        self._recent: OrderedDict[tuple[Any, Any], None] = OrderedDict()
        self._waiting: tuple[int, list[Piece]] | None = None  # a group planned that did not fit

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def on_group(
        self, token: Any, plan: Callable[[int], Sequence[Extent] | None], groups: int, current: int
    ) -> None:
        """Before group ``current`` of ``groups`` is read: hint groups ``current``... within the
        budget. ``token`` names the pass (a new one starts a new window). ``plan(g)`` is None
        while a part group ``g`` reads is not open: hinting waits there until it is."""
        if not self.enabled:
            return
        if token is not self._token:
            self._reset(token)
        if self._next < current:
            self._next = current
        while self._ahead and self._ahead[0][0] < current:
            self._ahead.popleft()
        used = sum(n for _, n in self._ahead)
        while self._next < groups and self._next - current < MAX_GROUPS_AHEAD and used < self.budget:
            if self._waiting is not None and self._waiting[0] == self._next:  # planned, not hinted
                pieces = [p for p in self._waiting[1] if p[0] not in self._recent]
            else:
                try:
                    extents = plan(self._next)
                except (OSError, ImgpackError):  # the real read reports it
                    extents = []
                if extents is None:
                    break
                pieces = self._new_pieces(extents)
            if used and used + sum(w for _, _, w in pieces) > self.budget:
                self._waiting = (self._next, pieces)
                break  # the whole of this group next time, rather than part of it now
            pieces = self._within(pieces, self.budget - used)
            taken = sum(w for _, _, w in pieces)
            self._remember(pieces)
            self._submit(pieces)
            self._ahead.append((self._next, taken))
            used += taken
            self._next += 1
        self.peak_ahead = max(self.peak_ahead, used)

    def _new_pieces(self, extents: Sequence[Extent]) -> list[Piece]:
        """(key, what to hint, bytes it costs) not hinted lately, in the order first needed."""
        out: dict[tuple[Any, Any], Piece] = {}
        size = self.piece
        key: tuple[Any, Any]
        for extent in extents:
            if callable(extent.file):
                key = ("file", extent.name)
                if key not in self._recent and key not in out:
                    out[key] = (key, extent.file, max(PAGE, -(-int(extent.length) // PAGE) * PAGE))
                continue
            offsets, lengths = np.atleast_1d(extent.offset), np.atleast_1d(extent.length)
            keep = lengths > 0
            offsets, lengths = offsets[keep], lengths[keep]
            numbers = spans(offsets // size, (offsets + lengths - 1) // size)
            _, first_seen = np.unique(numbers, return_index=True)
            for p in numbers[np.sort(first_seen)].tolist():  # each piece once, in the order needed
                key = (extent.file, p)
                if key not in self._recent and key not in out:
                    out[key] = (key, extent.file, size)
        return list(out.values())

    @staticmethod
    def _within(pieces: list[Piece], room: int) -> list[Piece]:
        kept, total = [], 0
        for piece in pieces:
            if total + piece[2] > room:
                break
            kept.append(piece)
            total += piece[2]
        return kept

    def _remember(self, pieces: list[Piece]) -> None:
        recent = self._recent
        for key, _, _ in pieces:
            recent[key] = None
        limit = max(1, self.budget * RECENT_BUDGETS // PAGE)
        while len(recent) > limit:
            recent.popitem(last=False)

    def _submit(self, pieces: list[Piece]) -> None:
        """Hint ``pieces``: runs of neighbouring pieces of one descriptor as one call each."""
        jobs: list[tuple[Callable[..., None], tuple]] = []
        runs: dict[int, list[int]] = {}
        for key, target, weight in pieces:
            if callable(target):
                jobs.append((_hint_file, (target,)))
                self.hinted_bytes += weight
            else:
                runs.setdefault(target, []).append(key[1])
        for fd, numbers in runs.items():
            numbers.sort()
            start = prev = numbers[0]
            for p in numbers[1:] + [None]:
                if p is not None and p == prev + 1:
                    prev = p
                    continue
                length = (prev + 1 - start) * self.piece
                jobs.append((advise, (fd, start * self.piece, length)))
                self.hinted_bytes += length
                if p is not None:
                    start = prev = p
        for fd in runs:
            self._take_over(fd)
        files = [j for j in jobs if j[0] is _hint_file]  # each its own job: opening one may wait
        ranges = [args for job, args in jobs if job is advise]
        batch = [(_advise_all, (ranges,))] if ranges else []  # one wake-up of a thread per group
        pool = self._executor()
        for job, args in batch + files:
            if pool is None:
                _quietly(job, *args)
            else:
                pool.submit(_quietly, job, *args)

    def _take_over(self, fd: int) -> None:
        """``take_over(fd)`` once per open file (a descriptor number is reused by the next open,
        and a forked worker opens its files anew)."""
        try:
            st = os.fstat(fd)
            key = (os.getpid(), fd, st.st_dev, st.st_ino)
            if key not in self._taken:
                take_over(fd)
                self._taken.add(key)
        except OSError:  # closed meanwhile: the real read reports what is wrong
            pass

    def _executor(self) -> ThreadPoolExecutor | None:
        return self._pool.get() if self.threads > 0 else None

    def wait(self) -> None:
        """Let the hints made so far finish (tests)."""
        self._pool.shutdown()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_token"] = None
        return state
