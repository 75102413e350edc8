"""Ray's re-cut without decoding twice: the preprocessed results of a part, carried to the parts
written again on the exact cut (packer/engine/_part_plan.py).

A Ray task returns, besides its part's record, the list of its results (encoded samples and
skips) into Ray's object store, unless they pass ``CARRY_BYTES`` (then only the record). When
the skips are known and parts are packed again on the exact cut, each task is handed the
results of the earlier tasks whose source positions overlap its own and preprocesses only the
files none of them holds. The driver drops the results of the parts that can no longer be cut
again (the skip-free prefix of the pack order) as soon as it knows them, so a pack without
skips keeps only the few parts that finished out of order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from packer.engine.parts import SKIPPED_AT_KEY, SOURCE_COUNT_KEY, SOURCE_START_KEY, Failure, preprocess_items
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.formats.writer_base import PartResult

CARRY_BYTES = 256 << 20  # the most encoded bytes of one part kept for a re-cut
Carried = dict[int, tuple[int, Any]]  # pack-order start -> (source files, object ref of the results)
Result = PackedSample | Failure


class Keeper:
    """The results a task passes through, kept while they stay under ``CARRY_BYTES``."""

    def __init__(self) -> None:
        self.kept: list[Result] | None = []
        self.size = 0

    def through(self, results: Iterable[Result]) -> Iterator[Result]:
        for result in results:
            if self.kept is not None:
                self.kept.append(result)
                self.size += 0 if isinstance(result, tuple) else len(result.data)
                if self.size > CARRY_BYTES:
                    self.kept = None  # too large to carry: a re-cut decodes this part again
            yield result


def overlapping(carried: Carried, start: int, count: int) -> list[tuple[int, int, Any]]:
    """The carried results whose source positions overlap ``[start, start + count)``."""
    return [(s, n, ref) for s, (n, ref) in sorted(carried.items()) if s < start + count and s + n > start]


def carried_or_preprocessed(
    items: Sequence[Any],
    start: int,
    sources: list[tuple[int, int, Any]],
    spec: PreprocessSpec,
    storage_options: dict[str, Any] | None,
    schema: Mapping[str, str] | None,
) -> Iterator[Result]:
    """The results of ``items`` (at ``start`` in the pack order), in order: from the carried
    ``sources`` where one holds them, else preprocessed here."""
    have: dict[int, Result] = {}
    if sources:
        import ray

        for source_start, _, ref in sources:
            for offset, result in enumerate(ray.get(ref) or []):
                if start <= source_start + offset < start + len(items):
                    have[source_start + offset] = result
    missing = [items[i] for i in range(len(items)) if start + i not in have]
    fresh = preprocess_items(missing, spec, storage_options, schema)
    for i in range(len(items)):
        yield have[start + i] if start + i in have else next(fresh)


def settle(carried: Carried, done: Mapping[int, PartResult]) -> None:
    """Drop the carried results no re-cut can need: those of the parts before the first skip."""
    by_start = {r.extra.get(SOURCE_START_KEY): r for r in done.values()}
    at = 0
    while at in by_start and not by_start[at].extra.get(SKIPPED_AT_KEY):
        count = int(by_start[at].extra.get(SOURCE_COUNT_KEY) or 0)
        if count == 0:
            break
        at += count
    for s in [s for s, (n, _) in carried.items() if s + n <= at]:
        del carried[s]
