"""The byte ranges a pass reads from remote shards, and the requests that fetch them.

Planning runs at the start of every pass in every DataLoader worker, over the whole rank's reads
(``readers.remote._spool``): for a rank of an ImageNet-sized epoch that is 10^5 to 10^6 reads,
so every step here works on arrays, never on one read at a time in Python.

- ``read_ranges``: what ``reader.read_many(indices)`` reads for each planned group, as
  ``(shard, start byte, end byte)`` rows: its blocks (indices closer than the format's merge gap,
  the records between them included), cut where a block crosses from one shard into the next.
- ``stretches``: the reads cut into runs of a quarter to all of the byte budget, each cut where
  the fewest bytes are needed on both sides of it.
- ``plan_requests``: inside a stretch, ranges of a shard closer than the merge gap become one
  request of at most ``request_bytes``; requests are ordered by first need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

Range = tuple[int, int, int]  # (shard position, start byte, end byte)


class Budget(Protocol):
    @property
    def ahead_bytes(self) -> int: ...
    @property
    def merge_gap(self) -> int: ...
    @property
    def request_bytes(self) -> int: ...


@dataclass
class Request:
    shard: int
    start: int
    end: int
    uses: int = 0  # planned reads not yet served from it
    future: Any = None

    @property
    def size(self) -> int:
        return self.end - self.start


def as_table(reads: Any) -> np.ndarray:
    """``reads`` (rows of shard, start, end) as an (n, 3) int64 array."""
    return np.asarray(reads, dtype=np.int64).reshape(-1, 3)


# -- what a pass reads --------------------------------------------------------------------------
def read_ranges(reader: Any, groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(reads as (n, 3) rows of shard, start byte, end byte; the group each read belongs to), in
    the order ``reader.read_many(groups[0])``, ``read_many(groups[1])``... read them.
    ``reader``: ``merge_gap``, ``manifest.shards`` and ``byte_ranges(position, a, b)`` (where local
    records [a, b) of an open shard lie, for arrays a and b)."""
    lengths = np.array([len(g) for g in groups], dtype=np.int64)
    if not lengths.sum():
        return np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64)
    index = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups])
    group = np.repeat(np.arange(len(groups), dtype=np.int64), lengths)
    order = np.lexsort((index, group))  # read_many reads each group's unique indices ascending
    index, group = index[order], group[order]
    fresh = np.ones(len(index), dtype=bool)
    fresh[1:] = (index[1:] != index[:-1]) | (group[1:] != group[:-1])
    index, group = index[fresh], group[fresh]
    cut = np.ones(len(index), dtype=bool)
    cut[1:] = (group[1:] != group[:-1]) | (np.diff(index) > reader.merge_gap)
    first = np.flatnonzero(cut)
    last = np.append(first[1:], len(index)) - 1
    starts, stops, run_group = index[first], index[last] + 1, group[first]
    starts, stops, run_group, shard = _split_at_shards(reader, starts, stops, run_group)
    firsts = np.array([s.first for s in reader.manifest.shards], dtype=np.int64)
    local_a, local_b = starts - firsts[shard], stops - firsts[shard]
    begin, end = np.zeros(len(shard), dtype=np.int64), np.zeros(len(shard), dtype=np.int64)
    for position in np.unique(shard).tolist():
        here = shard == position
        begin[here], end[here] = reader.byte_ranges(position, local_a[here], local_b[here])
    return np.stack([shard, begin, end], axis=1), run_group


def _split_at_shards(
    reader: Any, starts: np.ndarray, stops: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Blocks [start, stop) cut where they cross into the next shard (a block is read shard by
    shard), with each piece's shard."""
    firsts = np.array([s.first for s in reader.manifest.shards], dtype=np.int64)
    shard = np.searchsorted(firsts, starts, side="right") - 1
    last_shard = np.searchsorted(firsts, stops - 1, side="right") - 1
    crossing = np.flatnonzero(last_shard != shard)
    if not len(crossing):
        return starts, stops, group, shard
    pieces: list[tuple[int, int, int, int]] = []
    for k in crossing.tolist():  # rare: a block over a shard's end
        at, stop = int(starts[k]), int(stops[k])
        for position in range(int(shard[k]), int(last_shard[k]) + 1):
            end = min(stop, reader.manifest.shards[position].stop)
            pieces.append((k, at, end, position))
            at = end
    keep = np.ones(len(starts), dtype=bool)
    keep[crossing] = False
    extra = np.array(pieces, dtype=np.int64)
    rows = np.concatenate([np.flatnonzero(keep), extra[:, 0]])
    order = np.argsort(rows, kind="stable")  # pieces where their block was
    return (
        np.concatenate([starts[keep], extra[:, 1]])[order],
        np.concatenate([stops[keep], extra[:, 2]])[order],
        np.concatenate([group[keep], group[extra[:, 0]]])[order],
        np.concatenate([shard[keep], extra[:, 3]])[order],
    )


def part_order(table: np.ndarray) -> list[int]:
    """The shard positions of ``table``'s reads in the order they are first needed."""
    shards, first = np.unique(table[:, 0], return_index=True)
    return shards[np.argsort(first)].tolist()


# -- the requests -------------------------------------------------------------------------------
def plan_requests(reads: Any, settings: Budget) -> tuple[list[Request], np.ndarray]:
    """(requests in the order the pass first needs them, the request serving each read).

    ``reads`` are the byte ranges the consumer will ask for, in its order. They are cut into
    stretches (``stretches``); inside one, ranges of a shard closer than the merge gap become one
    request of at most ``request_bytes`` (a single bigger range is its own request).
    """
    table = as_table(reads)
    serving = np.zeros(len(table), dtype=np.int64)
    spans: list[np.ndarray] = []
    needs: list[np.ndarray] = []
    count = 0
    for first, last in stretches(table, settings):
        span, member, need = _merge(table[first:last], settings)
        order = np.argsort(need, kind="stable")  # by first need
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        serving[first:last] = count + rank[member]
        spans.append(span[order])
        needs.append(need[order] + first)
        count += len(order)
    if not spans:
        return [], serving
    span = np.concatenate(spans)
    uses = np.bincount(serving, minlength=len(span))
    requests = [Request(int(s), int(a), int(b), int(u)) for (s, a, b), u in zip(span.tolist(), uses.tolist())]
    return requests, serving


def _merge(table: np.ndarray, settings: Budget) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge the reads of one stretch: (request rows of shard, start, end; the request of each
    read; each request's first read, relative to the stretch)."""
    n = len(table)
    order = np.lexsort((table[:, 2], table[:, 1], table[:, 0]))  # by shard, start, end
    shard, start, end = table[order, 0], table[order, 1], table[order, 2]
    big = int(end.max()) + 1 if n else 1
    reach = np.maximum.accumulate(end + shard * big) - shard * big  # furthest end so far, per shard
    joins = np.zeros(n, dtype=bool)
    joins[1:] = (shard[1:] == shard[:-1]) & (start[1:] - reach[:-1] <= settings.merge_gap)
    group = np.cumsum(~joins) - 1
    heads = np.flatnonzero(~joins)
    tails = np.append(heads[1:], n) - 1
    request = group.copy()  # a group within request_bytes is one request
    group_end = np.maximum.reduceat(end, heads)
    too_big = np.flatnonzero(group_end - start[heads] > settings.request_bytes)
    if len(too_big):
        request = _split_big_groups(start, end, heads, tails, too_big, settings.request_bytes)
    count = int(request.max()) + 1 if n else 0
    member = np.empty(n, dtype=np.int64)
    member[order] = request
    rows = np.zeros((count, 3), dtype=np.int64)
    rows[:, 1] = np.iinfo(np.int64).max
    np.minimum.at(rows[:, 1], request, start)
    np.maximum.at(rows[:, 2], request, end)
    rows[request, 0] = shard
    need = np.full(count, n, dtype=np.int64)
    np.minimum.at(need, member, np.arange(n))
    return rows, member, need


def _split_big_groups(
    start: np.ndarray, end: np.ndarray, heads: np.ndarray, tails: np.ndarray, big: np.ndarray, limit: int
) -> np.ndarray:
    """Request numbers for sorted reads whose merge groups ``big`` span more than ``limit``
    bytes: such a group is cut greedily, a read joining the request before it while the request
    stays within ``limit`` (a single bigger read is its own request)."""
    request = np.zeros(len(start), dtype=np.int64)
    splits = np.zeros(len(start), dtype=bool)  # a new request starts at this read
    splits[heads] = True
    for g in big.tolist():
        lo, hi = int(heads[g]), int(tails[g])
        first, reach = int(start[lo]), int(end[lo])
        for k in range(lo + 1, hi + 1):
            if max(reach, int(end[k])) - first > limit:
                splits[k] = True
                first, reach = int(start[k]), int(end[k])
            else:
                reach = max(reach, int(end[k]))
    request[:] = np.cumsum(splits) - 1
    return request


def stretches(reads: Any, settings: Budget) -> list[tuple[int, int]]:
    """The reads cut into runs ``[first, last)`` of a quarter to the whole of the byte budget,
    each cut where the fewest bytes are needed on both sides of it.

    Ranges merged into one request must be needed at about the same time, or the request is held
    (or fetched twice) across everything between. A shuffled order reads a shuffle window's blocks
    all through the window, and a window's blocks are read by no other: cutting where a window
    ends, as this does whenever a whole window fits between the bounds, fetches each block once.
    "Needed on both sides" is measured on cells of the merge gap: a cell's bytes count from its
    first read to its last."""
    table = as_table(reads)
    n = len(table)
    if n == 0:
        return []
    sizes = table[:, 2] - table[:, 1]
    total = np.concatenate([[0], np.cumsum(sizes)])
    gap = max(1, settings.merge_gap)
    _, cell = np.unique(table[:, 0] * (1 << 40) + table[:, 1] // gap, return_inverse=True)
    cell = cell.ravel()
    k = np.arange(n)
    first = np.full(cell.max() + 1, n, dtype=np.int64)
    last = np.zeros_like(first)
    low = np.full_like(first, np.iinfo(np.int64).max)
    high = np.zeros_like(first)
    np.minimum.at(first, cell, k)
    np.maximum.at(last, cell, k)
    np.minimum.at(low, cell, table[:, 1])
    np.maximum.at(high, cell, table[:, 2])
    # crossing[b]: bytes of cells read both before read b and from it on
    delta = np.zeros(n + 2, dtype=np.int64)
    np.add.at(delta, first + 1, high - low)
    np.add.at(delta, last + 1, low - high)
    crossing = np.cumsum(delta)
    shortest, longest = max(1, settings.ahead_bytes // 4), max(1, settings.ahead_bytes)
    out, start = [], 0
    while start < n:
        if total[n] - total[start] <= longest:
            out.append((start, n))
            break
        lo = max(start + 1, int(np.searchsorted(total, total[start] + shortest)))
        hi = max(lo, int(np.searchsorted(total, total[start] + longest, side="right")) - 1)
        window = crossing[lo : hi + 1]
        cut = hi - int(np.argmin(window[::-1]))  # the latest of the least-crossed boundaries
        out.append((start, cut))
        start = cut
    return out
