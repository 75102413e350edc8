"""``--dedup exact|near`` at pack time: a sample whose stored bytes (exact) or pixels (near: the
perceptual hash within ``--near-distance`` bits) repeat a sample kept before it in the pack
order is skipped, recorded in the manifest's ``skipped`` as "exact duplicate of <path>" or
"near duplicate of <path>, distance d".

The copy kept is the first in the pack order (a pure function of the source and ``--seed``),
compared only with the samples kept before it, so the result does not depend on the number of
workers or the engine: the local engine filters its in-order stream of results here; the Ray
engine, whose parts are written side by side, first hashes every sample (a pass of Ray tasks),
runs the same ``Deduper`` over the hashes in pack order, and hands each task the skips of its
part (so with Ray, ``--dedup`` preprocesses every image twice).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import click
import numpy as np

from packer.dedup.part_hashes import part_records
from packer.engine.parts import SKIPPED_AT_KEY, SOURCE_START_KEY, Failure
from readers.errors import ImgpackError, OptionError
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import PartResult
from readers.store.near_index import IncrementalIndex

DEDUP_MODES = ("exact", "near")
DEFAULT_NEAR_DISTANCE = 12  # bits of 64: recall 0.96, no false pair on the planted set (docs/dedup.md)
Result = PackedSample | Failure


@dataclass(frozen=True)
class Known:
    """The samples of the dataset an append adds to (``--append --dedup``): its hash records
    (readers/store/sample_hashes.py) and source paths, by index; new samples are compared with them."""

    records: np.ndarray
    rels: list[str]
    dataset: str

    @classmethod
    def of(cls, dataset: str, storage_options: dict[str, Any] | None = None) -> Known:
        from packer.dedup.overlap import load_hashes
        from readers.store.sample_sources import source_paths

        records = load_hashes(dataset, storage_options, progress=False).records
        try:
            rels = source_paths(dataset, storage_options)
        except ImgpackError:  # a dataset without a source-path list: name the sample
            rels = []
        if len(rels) != len(records):
            rels = [f"sample {i}" for i in range(len(records))]
        return cls(records, [f"{rel} (in {dataset})" for rel in rels], str(dataset))


def dedup_record(mode: str | None, distance: int | None) -> dict[str, Any] | None:
    """The manifest's (and the progress fingerprint's) record of the dedup asked; None: none."""
    if mode is None:
        if distance is not None:
            raise OptionError("--near-distance needs --dedup near")
        return None
    if mode not in DEDUP_MODES:
        raise OptionError(f"--dedup {mode}: use one of {', '.join(DEDUP_MODES)}")
    if mode == "exact" and distance is not None:
        raise OptionError("--near-distance applies to --dedup near only")
    distance = DEFAULT_NEAR_DISTANCE if distance is None else distance
    if not 0 <= distance <= 32:
        raise OptionError(f"--near-distance {distance}: use 0 to 32 bits (of the 64-bit hash)")
    return {"mode": mode, "distance": distance if mode == "near" else None}


class Deduper:
    """The samples kept so far, and why a new one is a duplicate of one of them."""

    def __init__(self, record: dict[str, Any]):
        self.digests: dict[bytes, int] = {}
        self.rels: list[str] = []
        near = record["mode"] == "near"
        self.index = IncrementalIndex(int(record["distance"])) if near else None

    def reason(self, phash: int, digest: bytes) -> str | None:
        kept = self.digests.get(digest)
        if kept is not None:
            return f"exact duplicate of {self.rels[kept]}"
        hit = self.index.nearest(phash) if self.index is not None else None
        if hit is not None:
            return f"near duplicate of {self.rels[hit[0]]}, distance {hit[1]}"
        return None

    def keep(self, phash: int, digest: bytes, rel: str) -> None:
        self.digests.setdefault(digest, len(self.rels))
        self.rels.append(rel)
        if self.index is not None:
            self.index.add(phash)

    def check(self, result: Result) -> Result:
        """``result``, or the skip it becomes as a duplicate of a kept sample."""
        if isinstance(result, tuple):
            return result
        why = self.reason(result.phash, result.digest)
        if why is not None:
            return (result.source_index, result.rel, why)
        self.keep(result.phash, result.digest, result.rel)
        return result

    def seed_known(self, known: Known | None) -> None:
        """Learn the samples already in the dataset appended to, before any new one."""
        if known is not None:
            for record, rel in zip(known.records, known.rels):
                self.keep(int(record["phash"]), bytes(record["digest"]), rel)

    def seed(self, results: Iterable[PartResult], rel_at: Callable[[int], str]) -> None:
        """Learn the kept samples of parts written before (a resumed pack), in pack order;
        ``rel_at``: the relative path at a pack-order position."""
        for result in sorted(results, key=lambda r: r.extra.get(SOURCE_START_KEY, 0)):
            records = part_records(result)
            if records is None:
                continue
            skipped = set(result.extra.get(SKIPPED_AT_KEY, []))
            start = result.extra.get(SOURCE_START_KEY, 0)
            kept_positions = (p for p in range(len(records) + len(skipped)) if p not in skipped)
            for record, position in zip(records, kept_positions):
                self.keep(int(record["phash"]), bytes(record["digest"]), rel_at(start + position))


def deduper_for(
    record: dict[str, Any] | None, before: list[PartResult], items: Any, known: Known | None = None
) -> Deduper | None:
    """The --dedup filter of a stream (None without --dedup), knowing the samples of the dataset
    appended to (``known``) and those kept by the parts written ``before`` (``items``: the source
    items in pack order)."""
    if record is None:
        return None
    deduper = Deduper(record)
    deduper.seed_known(known)
    deduper.seed(before, lambda position: items[position].rel)
    return deduper


def deduped(stream: Iterator[Result], deduper: Deduper | None) -> Generator[Result, None, None]:
    """``stream`` with each duplicate turned into its skip; closing it closes ``stream``."""
    try:
        for result in stream:
            yield result if deduper is None else deduper.check(result)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def skips_of(
    hashed: Iterable[tuple[int, str, int, bytes] | Failure],
    record: dict[str, Any],
    known: Known | None = None,
) -> dict[int, str]:
    """{source index: reason} of the duplicates among ``hashed`` ((source index, rel, phash,
    digest) in pack order, or a failure), as the in-order stream would find them."""
    deduper = Deduper(record)
    deduper.seed_known(known)
    out = {}
    for item in hashed:
        if len(item) == 3:
            continue
        index, rel, phash, digest = item  # type: ignore[misc]
        why = deduper.reason(phash, digest)
        if why is None:
            deduper.keep(phash, digest, rel)
        else:
            out[index] = why
    return out


def applied(results: Iterable[Result], skips: dict[int, str]) -> Iterator[Result]:
    """``results`` with the samples named in ``skips`` turned into their skips (a Ray task)."""
    for result in results:
        if not isinstance(result, tuple) and result.source_index in skips:
            yield (result.source_index, result.rel, skips[result.source_index])
        else:
            yield result


def dedup_options(fn: Callable) -> Callable:
    """``--dedup`` and ``--near-distance`` on every source command (through imagefolder's)."""
    fn = click.option(
        "--near-distance",
        type=click.IntRange(0, 32),
        default=None,
        help=f"With --dedup near: the most bits of 64 in which a near copy's hash differs "
        f"[default: {DEFAULT_NEAR_DISTANCE}].",
    )(fn)
    return click.option(
        "--dedup",
        type=click.Choice(DEDUP_MODES),
        default=None,
        help="Skip duplicates of a sample kept before (the first in the pack order is kept): exact: "
        "the same stored bytes; near: the same picture resized, recompressed or slightly cropped.",
    )(fn)
