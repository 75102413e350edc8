"""The skeleton every resumable stream of samples shares: epochs, ranks, workers, resume.

A subclass (``PackedIterable`` over one dataset, ``MixedIterable`` over several) sets
``self.order`` (a ``readers.order.epoch_order.OrderSpec``) and ``self.batch_size``, calls ``init_stream()``,
and implements ``_emit(positions, spans)``: read the samples at ``positions[a:b]`` for each span
and yield them (a whole batch per span, or one item per sample), adding what it yields to
``self._pass.samples``. Everything else — which positions this rank and this DataLoader worker
read, ``set_epoch`` reaching persistent workers, ``len()``, and the resume rules of
``readers.order.resume`` — lives here once; the epoch and resume bookkeeping it shares with the DALI
loader is ``readers.order.epoch_cursor.EpochCursor``.

Each new pass is the next epoch unless the epoch was chosen for it (``set_epoch``, or a loaded
state's epoch). The process that starts a pass decides its epoch (``begin_pass``): the one that
iterates, or ``make_loader``'s loader before its workers start; workers read it from shared memory,
so every worker count, persistent workers included, reads the same epochs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from readers.errors import OptionError
from readers.order.epoch_cursor import EpochCursor
from readers.order.epoch_order import OrderSpec, num_chunks, worker_chunks
from readers.order.resume import Pass, ResumeError, ResumePoint, advance


class EpochStream(EpochCursor, IterableDataset):
    """Epochs, rank and worker split, ``len()`` and resume for a stream of samples or batches."""

    order: OrderSpec
    batch_size: int | None

    def init_stream(self) -> None:
        self.init_epochs(shared=True)  # shared with worker processes, so persistent workers see set_epoch
        # Samples worker processes have yielded: lets state_dict() in the main process tell
        # "nothing read yet" from "read in workers, which it cannot see".
        self._worker_yields = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._running = False  # a pass is being iterated in this process
        self._pass_start: ResumePoint | None = None  # where the running pass started
        # Names this stream's spools (readers/remote/_spool.py) in every copy of it, workers' too:
        # a pass that opens one removes those earlier passes of the same stream left behind.
        self.spool_tag = os.urandom(4).hex()

    def set_loader_batch_size(self, loader_batch_size: int | None) -> None:
        """The DataLoader's batch size on the per-sample path (workers take turns by that many)."""
        if loader_batch_size is not None and loader_batch_size < 1:
            raise OptionError(f"loader_batch_size must be a positive integer, got {loader_batch_size}")
        self.loader_batch_size = loader_batch_size
        unit = self.batch_size or loader_batch_size or 1
        self.order = dataclasses.replace(self.order, unit=unit)

    # -- epoch, length, resume (the rules of readers.order.epoch_cursor) -------------------------------
    def set_epoch(self, epoch: int) -> None:
        if self._resume is not None and int(self._worker_yields.item()) > 0:
            self._resume = None  # DataLoader workers have read the resumed epoch (their copies)
        super().set_epoch(epoch)
        self._worker_yields.zero_()

    def _next_pass_begun(self) -> None:
        self._worker_yields.zero_()

    @property
    def num_samples(self) -> int:
        """Samples this rank reads in the current epoch (what is left of it after a resume)."""
        resume = self._pending_resume()
        order = self.order.at_epoch(self._next_epoch())
        if resume is None:
            return order.samples_per_rank
        return order.samples_from(resume.position) - resume.offset

    def __len__(self) -> int:
        """Batches for this rank when ``batch_size`` is set, else samples (what is left after a resume)."""
        if self.batch_size is None:
            return self.num_samples
        return num_chunks(self.num_samples, self.batch_size, self.order.drop_last)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, as a plain dict to save with a checkpoint.

        In a DataLoader worker this is that worker's state (the protocol of torchdata's
        ``StatefulDataLoader``, which calls it). In the process that iterates (``num_workers=0``)
        it is exact with no argument. With a plain ``DataLoader`` and workers, pass ``consumed``:
        the samples this rank has taken from the loader since the current ``iter(loader)`` began.
        """
        info = get_worker_info()
        if info is not None:
            if self._pass is None:
                return self._state(self._pending_resume() or self._start_point())
            return self._state(self._pass.worker_state())
        if consumed is None:
            if self._pass is None and int(self._worker_yields.item()) > 0:
                raise ResumeError(
                    "state_dict() cannot see what DataLoader workers have read: use "
                    "readers.make_loader (a StatefulDataLoader) and loader.state_dict(), or pass "
                    "consumed=<samples taken from the loader since iter(loader) began>"
                )
            return self._state(self._point_here())
        start = self._pending_resume() or self._start_point()
        taken = self.order.taken_positions(start.epoch, start.position, start.offset, int(consumed))
        return self._state(advance(self.order, start, taken))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (from ``state_dict`` or ``loader.state_dict()``): the next
        iteration of that epoch yields exactly what an uninterrupted run would have yielded next."""
        in_worker = get_worker_info() is not None
        if self._running and not in_worker:
            raise ResumeError(
                "load_state_dict() was called while this stream is being iterated; call it before "
                "the `for` loop starts (then that loop resumes)"
            )
        self._resume_at(self._checked_point(state, in_worker), in_worker)
        self._worker_yields.zero_()

    def _positions(self, epoch: int, start: int) -> np.ndarray:
        """What ``_emit`` is handed: this rank's sequence for ``epoch`` from global position ``start``."""
        return self.order.epoch_order(epoch, start)

    def _emit(self, positions: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None:
            yield from self._iterate(info.id, info.num_workers)
            return
        self.begin_pass()
        self._running = True
        try:
            yield from self._iterate(0, 1)
        finally:
            self._running = False

    def _iterate(self, worker: int, workers: int) -> Iterator[Any]:
        info = get_worker_info()
        epoch = self.epoch
        start = self.pass_start(epoch)
        self._resume = None  # used up by this iteration (persistent workers must not reuse it)
        skip = start.worker_skip(worker, workers)
        self._pass = Pass(epoch, ResumePoint(epoch, start.position, start.offset), worker, workers, skip)
        positions = self._positions(epoch, start.position)
        self._pass_start = start
        if info is not None:
            self._worker_yields.fill_(1)
        groups = self.worker_groups(len(positions), start.offset, worker, workers, skip)
        yield from self._emit_pass(positions, groups)

    def rank_groups(self, num_positions: int) -> list[list[list[tuple[int, int]]]] | None:
        """The groups of every DataLoader worker of this rank in the running pass (what each worker's
        ``_emit_pass`` is handed), or None where a worker resumes with progress of its own, which
        only that worker knows."""
        start, running = self._pass_start, self._pass
        if start is None or running is None or start.worker_progress is not None:
            return None
        workers = running.num_workers
        return [self.worker_groups(num_positions, start.offset, w, workers) for w in range(workers)]

    def worker_groups(
        self, num_positions: int, offset: int, worker: int, workers: int, skip: int = 0
    ) -> list[list[tuple[int, int]]]:
        """The groups of spans ``worker`` of ``workers`` emits in a pass over ``num_positions``
        positions that starts ``offset`` samples in, having produced ``skip`` of its own already.
        A worker's next few chunks are read together, so per-sample chunks still read in blocks."""
        spans = trimmed(worker_chunks(num_positions, self.order.unit, worker, workers, False), offset)
        if skip:
            spans = trimmed(spans, skip, relative=True)
        size = max(1, self.order.block_size // self.order.unit)
        listed = list(spans)
        return [listed[i : i + size] for i in range(0, len(listed), size)]

    def _emit_pass(self, positions: np.ndarray, groups: list[list[tuple[int, int]]]) -> Iterator[Any]:
        """Emit a pass's ``groups`` of spans in turn. The whole pass is known before its first
        read, so a subclass may look ahead (``read_ahead``) without changing what is yielded."""
        for i, group in enumerate(groups):
            self.read_ahead(positions, groups, i)
            yield from self._emit(positions, group)

    def read_ahead(self, positions: np.ndarray, groups: list[list[tuple[int, int]]], current: int) -> None:
        """Called before ``groups[current]`` is emitted: a place to ask storage for later groups."""

    def prime_pass(self, epoch: int, start: ResumePoint, num_workers: int) -> Any:
        """Called by the loader in its process before ``num_workers`` workers start a pass over
        ``epoch`` from ``start``: something to ``start()`` once they are forked and ``stop()``
        when the pass ends, or None (readers/remote/prime.py)."""
        return None


def trimmed(spans: Iterator[tuple[int, int]], skip: int, relative: bool = False) -> Iterator[tuple[int, int]]:
    """``spans`` without their first positions: those below ``skip`` (absolute), or the first
    ``skip`` positions they cover (``relative``)."""
    for a, b in spans:
        cut = min(b, a + skip) if relative else max(a, min(b, skip))
        if relative:
            skip -= cut - a
        if cut < b:
            yield cut, b
