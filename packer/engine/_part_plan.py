"""Where a pack cuts its parts, and which parts already written still fit the cut.

Two rules, one per sharding option:
- ``--samples-per-shard N`` (and a format's default part size): part ``k`` holds the kept samples
  of dataset indices ``k*N`` to ``k*N + N - 1``, whatever was skipped. A skipped source file
  goes with the part of the next kept one; the files skipped after the last kept sample go with
  the last part. So the cut follows the skips, which are only known once files are decoded.
- ``--shards S``: part ``k`` holds source files ``k*n`` to ``k*n + n - 1`` (n = ceil(files/S))
  of the pack order, whatever is skipped among them: S parts, some shorter.

Every written part records where it starts in the pack order and how many source files it took
(``SOURCE_START_KEY``, ``SOURCE_COUNT_KEY``) besides the positions it skipped, so the skips
of every part written are known, and ``plan_parts`` cuts exactly as far as they reach. The
local engine writes parts in order from one stream, so its cut is exact at once. Ray writes
parts side by side on a provisional cut (every ``N`` source files, as if nothing were skipped),
then, every file's fate known, the exact cut: the parts before the first short one fit it and
stay, the rest are written again, and parts the exact cut no longer has are dropped. A pack
resumed after a kill continues from what its progress file records and ends with the same
parts as one never interrupted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.engine.parts import FIRST_KEY, SKIPPED_AT_KEY, SOURCE_COUNT_KEY, SOURCE_START_KEY, Failure
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import PartResult


@dataclass(frozen=True)
class Cut:
    part: int
    start: int  # position in the pack order of its first source file
    stop: int  # one past its last
    first: int  # the dataset index of its first kept sample
    exact: bool = True  # False: provisional (the skips ahead of it are not known yet)


@dataclass(frozen=True)
class Plan:
    cuts: list[Cut]
    exact: int  # how many of the cuts, from the first, are exact
    tail: int  # where in the pack order the exact cuts end

    def resume(self, done: dict[int, PartResult]) -> tuple[int, int]:
        """(part, pack-order position) an in-order writer continues from, the parts in ``done``
        fitting this plan."""
        for cut in self.cuts[: self.exact]:
            if cut.part not in done:
                return cut.part, cut.start
        return self.exact, self.tail

    def fits(self, result: PartResult, check_first: bool) -> bool:
        """Whether the written part ``result`` is the one this plan cuts under its number."""
        cut = next((c for c in self.cuts if c.part == result.part), None)
        if cut is None:
            return False
        extra = result.extra
        where = (extra.get(SOURCE_START_KEY), extra.get(SOURCE_COUNT_KEY))
        numbered = not check_first or extra.get(FIRST_KEY, 0) == cut.first
        return where == (cut.start, cut.stop - cut.start) and numbered


def plan_parts(total: int, per_part: int, by_kept: bool, done: dict[int, PartResult]) -> Plan:
    """The cut of ``total`` source files into parts of ``per_part`` kept samples (``by_kept``) or
    source files, as far as the parts written (``done``) tell."""
    if total == 0:
        return Plan([], 0, 0)
    if not by_kept:
        return _source_cut(total, per_part, done)
    kept, known = _known_kept(done)
    if known >= total:  # every file's fate is known: the final cut
        parts = max(1, -(-len(kept) // per_part))
        starts = [0] + [int(kept[k * per_part - 1]) + 1 for k in range(1, parts)]
        stops = [*starts[1:], total]
        cuts = [Cut(k, a, b, k * per_part) for k, (a, b) in enumerate(zip(starts, stops))]
        return Plan(cuts, len(cuts), total)
    # A part is exact when a kept sample of the known prefix follows it (else the files skipped
    # after it might be the last ones, and its own).
    exact = max(0, (len(kept) - 1) // per_part)
    starts = [0] + [int(kept[k * per_part - 1]) + 1 for k in range(1, exact + 1)]
    cuts = [Cut(k, starts[k], starts[k + 1], k * per_part) for k in range(exact)]
    at = starts[exact]
    # The rest on the provisional grid a pack with no skips cuts, so the parts Ray wrote before a
    # kill still match it (a part's number and first index are provisional too).
    for m in range(at // per_part, -(-total // per_part)):
        cuts.append(Cut(m, max(at, m * per_part), min(total, (m + 1) * per_part), m * per_part, exact=False))
    return Plan(cuts, exact, at)


def _source_cut(total: int, per_part: int, done: dict[int, PartResult]) -> Plan:
    cuts, first = [], 0
    for k, start in enumerate(range(0, total, per_part)):
        stop = min(total, start + per_part)
        cuts.append(Cut(k, start, stop, first))
        first += done[k].count if k in done else stop - start  # assumed: no skips where unknown
    return Plan(cuts, len(cuts), total)


def _known_kept(done: dict[int, PartResult]) -> tuple[np.ndarray, int]:
    """(the pack-order positions of the kept samples, how far from 0 the written parts tile the
    pack order without a gap)."""
    by_start: dict[int, PartResult] = {}
    for result in done.values():
        start = result.extra.get(SOURCE_START_KEY)
        if start is not None and result.extra.get(SOURCE_COUNT_KEY):
            by_start.setdefault(int(start), result)
    runs, at = [], 0
    while at in by_start:
        result = by_start[at]
        count = int(result.extra[SOURCE_COUNT_KEY])
        skipped = np.asarray(result.extra.get(SKIPPED_AT_KEY, []), dtype=np.int64)
        runs.append(np.delete(np.arange(at, at + count), skipped))
        at += count
    return (np.concatenate(runs) if runs else np.zeros(0, np.int64)), at


class Lookahead:
    """An iterator of preprocessed results that can be given some back (``push``)."""

    END = object()

    def __init__(self, results: Iterator[PackedSample | Failure]):
        self.results = results
        self.back: deque[PackedSample | Failure] = deque()

    def next(self) -> Any:
        return self.back.popleft() if self.back else next(self.results, self.END)

    def push(self, results: list[PackedSample | Failure]) -> None:
        self.back.extendleft(reversed(results))

    def more(self) -> bool:
        result = self.next()
        if result is self.END:
            return False
        self.push([result])
        return True


def fill_part(results: Lookahead, per_part: int) -> Iterator[PackedSample | Failure]:
    """The results of the next part of ``per_part`` kept samples: the skips before its first
    kept sample are its own, and after its last only when no kept sample follows them."""
    kept = 0
    while kept < per_part:
        result = results.next()
        if result is results.END:
            return
        kept += not isinstance(result, tuple)
        yield result
    skipped: list[PackedSample | Failure] = []
    while (result := results.next()) is not results.END:
        if not isinstance(result, tuple):
            results.push([*skipped, result])  # the next part's
            return
        skipped.append(result)
    yield from skipped  # the last part's
