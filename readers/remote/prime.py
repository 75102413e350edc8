"""The first requests of a pass, started by the rank's main process while its workers start.

A DataLoader worker of a remote pass spends its first 0.2-0.3 s fetching nothing: it is forked,
makes an S3 session of its own and reads each shard's index, and only then asks for the first
bytes the pass reads. The pass's epoch and start are decided in the main process before the
workers start (``PackedLoader.__iter__``), so the main process can plan what its workers will
plan and have the first requests under way meanwhile.

Before the workers are forked it reads the index of each shard the pass reads by ranges (tar
without a ``cache_dir``; the forked workers inherit the indexes and need neither a request nor a
session for them) and plans the rank's requests as every worker will
(``readers.remote.remote_ahead``); once they are forked it claims, fetches and publishes the
requests the workers' first batches wait for (those their first groups read from: a shuffled
pass's first window, often every shard) in the rank's spool (``readers.remote._spool``), as a
worker would: within ``IMGPACK_REMOTE_AHEAD_BYTES``, ``IMGPACK_REMOTE_REQUESTS`` at once, until
the pass ends. A worker that needs one of them maps it, or waits for it like for a request
another worker claimed; the later requests the workers fetch themselves, each process with its
own connections (one process's event loop would bound the rank's download).

Nothing here changes what is read: a worker whose plan came out otherwise (its spool has another
name) fetches for itself, and a failed request is met again by the worker that reads it. Parts
read whole through a ``cache_dir`` are not primed: a worker starts downloading them at once
(``PartFetcher``), and one that finds them cached makes no S3 session at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from readers.remote._range_plan import as_table, plan_requests, read_ranges
from readers.remote.remote_ahead import (
    AheadSettings,
    RankPlan,
    ahead_settings,
    open_shards,
    rank_plans,
    rank_spool,
    remote_readers,
)


class Primer:
    """Jobs run on helper threads of the main process from ``start`` (once its workers are
    forked: a fork must not meet a request in flight) until ``stop`` (the pass is over)."""

    def __init__(self, jobs: Sequence[Callable[[], Any]], threads: int):
        self.jobs = list(jobs)
        self.threads = max(1, threads)
        self.stopped = threading.Event()
        self.pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if not self.jobs or self.pool is not None:
            return
        self.pool = ThreadPoolExecutor(min(self.threads, len(self.jobs)), "imgpack-prime")
        for job in self.jobs:
            self.pool.submit(self._run, job)

    def _run(self, job: Callable[[], Any]) -> None:
        if self.stopped.is_set():
            return
        try:
            job()
        except Exception:  # noqa: BLE001 - the worker that reads it meets the failure and reports it
            self.stopped.set()  # and nothing more is fetched for a pass that is failing

    def stop(self) -> None:
        self.stopped.set()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)  # a request under way ends by its own bound


def prime_pass(stream: Any, epoch: int, start: Any, num_workers: int) -> Primer | None:
    """What the main process fetches for the pass of ``stream`` over ``epoch`` from ``start`` (a
    ``ResumePoint``) that ``num_workers`` DataLoader workers read; None where it has nothing to
    do: no remote reader, reading ahead off, fewer than two workers (a lone worker fetches for
    itself), or a resume with a worker's own progress (only that worker knows its plan). Plans
    and reads the indexes now; ``start()`` the result once the workers are forked."""
    if num_workers < 2 or start.worker_progress is not None:
        return None
    positions = stream._positions(epoch, start.position)
    if not remote_readers(stream, epoch, positions):
        return None
    settings = ahead_settings()
    if not settings.enabled:
        return None
    everyone = [
        stream.worker_groups(len(positions), start.offset, w, num_workers) for w in range(num_workers)
    ]
    jobs: list[Callable[[], Any]] = []
    for reader, rank in rank_plans(stream, epoch, positions, everyone, 0, os.getpid()):
        jobs += reader.prime_ahead(rank, settings)
    return Primer(jobs, settings.requests) if jobs else None


def first_within(sizes: Sequence[int], budget: int) -> int:
    """How many of ``sizes``, from the first, fit in ``budget`` bytes (at least one)."""
    total = np.cumsum(np.asarray(sizes, dtype=np.int64))
    return max(1, int(np.searchsorted(total, budget, side="right"))) if len(total) else 0


def first_batches(rank: RankPlan, group: np.ndarray, serving: np.ndarray) -> int:
    """How many of the rank's first requests its workers' first groups read from: what their
    first batches wait for (the rest they fetch themselves, each with its own connections)."""
    firsts = [int(np.argmax(rank.workers == w)) for w in np.unique(rank.workers).tolist()]
    reads = np.isin(group, firsts)
    return int(serving[reads].max()) + 1 if reads.any() else 0


def range_jobs(reader: Any, rank: RankPlan, settings: AheadSettings) -> list[Callable[[], Any]]:
    """The first of the rank's ranged requests from ``reader``, each fetched into its spool."""
    open_shards(reader, rank.planned, settings)
    reads, group = read_ranges(reader, rank.planned)
    requests, serving = plan_requests(as_table(reads), settings)
    if not requests:
        return []
    spool = rank_spool(reader, requests, serving, rank.workers[group], rank, settings)
    if spool is None:
        return []
    count = min(
        first_batches(rank, group, serving), first_within([r.size for r in requests], settings.ahead_bytes)
    )

    def job(index: int) -> Callable[[], Any]:
        request = requests[index]
        fetch = lambda: reader.handle(request.shard).read(request.start, request.size)  # noqa: E731
        return lambda: spool.prefetch(index, fetch)

    return [job(i) for i in range(count)]
