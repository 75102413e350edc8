"""``make_loader``: the DataLoader for a packed iterable, built right, with exact resume.

    it = open_iterable("train.lmdb", batch_size=256, seed=0)
    loader = make_loader(it, num_workers=8, pin_memory=True)
    state = loader.state_dict()            # at any step; save it with the model
    loader.load_state_dict(state)          # in a fresh run: the rest of the epoch, exactly

The loader is torchdata's ``StatefulDataLoader`` (the PyTorch ecosystem's resumable loader):

- batch mode (``open_iterable(batch_size=B)``): the workers assemble whole batches, so the loader
  runs with ``batch_size=None``; per-sample mode: ``batch_size`` is the loader's, and the iterable
  is told it so workers take turns by whole batches (the order is then the same for any
  ``num_workers``);
- ``state_dict()`` holds StatefulDataLoader's per-worker states (exact with any ``num_workers``,
  persistent workers or not, ``pin_memory`` or not) and, under ``"imgpack"``, the epoch's global
  position (``readers.order.resume``), counted here batch by batch;
- ``load_state_dict()`` restores the per-worker states when the world size and ``num_workers``
  (> 0) match, and otherwise resumes from the global position alone (elastic: another world size
  or number of workers; whole batches of every rank are the unit);
- a state saved after a pass finished names the next epoch at position 0: loaded, the next pass
  is that whole epoch, what the uninterrupted run reads next, with any ``num_workers``.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from readers.datasets.stream import EpochStream
from readers.errors import CallError, OptionError
from readers.fields.field_collate import field_collate
from readers.fields.targets import detection_collate
from readers.order.resume import ResumeError, ResumePoint, advance, check_worker_states, loader_workers
from readers.process import frozen_for_fork

STATE_KEY = "imgpack"


class PackedLoader(StatefulDataLoader):
    """A ``StatefulDataLoader`` over an ``open_iterable``/``mix`` stream, recording the global position."""

    dataset: EpochStream

    def __init__(self, dataset: EpochStream, **kwargs: Any):
        with warnings.catch_warnings():
            # torchdata 0.11 (its latest release) calls torch.set_vital, deprecated since torch
            # 2.9, on every construction; only that one message is silenced, only here.
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            super().__init__(dataset, **kwargs)
        self._chunks = 0  # batches handed to the training loop in the current pass
        self._pass_start: ResumePoint | None = None
        self._iterating = False

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (without it, each pass is the next epoch)."""
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # The epoch is decided here, before the workers start, and they read it from shared
        # memory; without workers the dataset's own iteration in this process is handed it.
        epoch = self.dataset.begin_pass(hand_over=self.num_workers == 0)
        self._pass_start = self.dataset.pass_start(epoch)
        self._chunks = 0
        self._iterating = True
        primer = None
        try:
            method = self._start_method() if self.num_workers > 0 else None
            # A remote pass: this process starts the workers' first requests while they start up
            # (its own children: a forkserver's workers are the server's, with spools of their own).
            if method in ("fork", "spawn"):
                primer = self.dataset.prime_pass(epoch, self._pass_start, self.num_workers)
            with frozen_for_fork(method == "fork"):
                batches = super().__iter__()  # persistent workers are forked at the first pass only
            if primer is not None:
                primer.start()  # after the workers are forked
            # After a restore StatefulDataLoader counts steps from the saved pass, while len() reports
            # what is left of it: torch's length-mismatch warning would fire for nothing.
            batches._IterableDataset_len_called = None
            if self.num_workers > 0:
                self.dataset._resume = None  # the workers have their copy; it must not apply twice
            for batch in batches:
                self._chunks += 1
                yield batch
            self._pass_start = None
        finally:
            if primer is not None:
                primer.stop()
            self._iterating = False  # done, or abandoned: state_dict() still says where it stopped

    def _start_method(self) -> str:
        """How the workers are started: ``fork``, ``spawn`` or ``forkserver``."""
        context = self.multiprocessing_context
        if context is not None:
            return context.get_start_method()
        chosen = multiprocessing.get_start_method(allow_none=True)  # without fixing it for the program
        return chosen or multiprocessing.get_all_start_methods()[0]

    def global_point(self) -> ResumePoint:
        """Where the epoch stands for the whole job (every rank is at the same step)."""
        if self._pass_start is None:
            return self.dataset._pending_resume() or self.dataset._start_point()
        start = self._pass_start
        order = self.dataset.order.at_epoch(start.epoch)
        taken = min(self._chunks * order.unit, order.samples_from(start.position) - start.offset)
        return advance(order, start, taken)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[STATE_KEY] = self.dataset._state(self.global_point())
        state[STATE_KEY]["num_workers"] = self.num_workers
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._iterating:
            raise ResumeError(
                "loader.load_state_dict() was called while the loader is being iterated; call it "
                "before the `for batch in loader` loop starts (then that loop resumes)"
            )
        if STATE_KEY not in state_dict:
            raise ResumeError(
                f"this loader state has no {STATE_KEY!r} entry: it was not saved by readers.make_loader"
            )
        state = dict(state_dict)
        position = dict(state.pop(STATE_KEY))
        saved_workers = loader_workers(position.pop("num_workers", None))
        self.dataset.load_state_dict(position)
        order = self.dataset.order
        same_placement = (
            saved_workers == self.num_workers
            and position["world_size"] == order.world_size
            and position["rank"] == order.rank
            and position["unit"] == order.unit
        )
        # Without workers the position above is exact (the stream runs in this process), and
        # StatefulDataLoader's own snapshot of it is of the last batch: after a finished pass that
        # is the old epoch's end, which would make the next pass an empty one. One rule for any
        # num_workers: a state names the epoch the next pass reads and where in it.
        if same_placement and saved_workers is not None and self.num_workers > 0:
            check_worker_states(state, saved_workers, position["epoch"], order, self.dataset.identity())
            super().load_state_dict(state)


# Batches a DataLoader keeps requested per worker on the whole-batch path (torch's default is 2).
# A raw or small batch takes a worker 1-2 ms, about as long as the hand-over of a request and a
# batch between the processes, so with 2 in flight workers spend half their time waiting for the
# next request (packer/bench/suites/raw_batch.py). Each in-flight batch holds one shared ring slot
# (readers.batch.shmring, at most MAX_SLOTS per worker), so memory stays bounded.
WHOLE_BATCH_PREFETCH = 4


def make_loader(
    dataset: EpochStream,
    *,
    batch_size: int | None = None,
    num_workers: int = 0,
    **loader_options: Any,
) -> PackedLoader:
    """A resumable loader for ``dataset`` (from ``open_iterable``), configured for its mode.

    ``batch_size`` is only for the per-sample path (``open_iterable`` without ``batch_size``);
    other keyword arguments go to the DataLoader (``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``, ``worker_init_fn``, ``collate_fn``...). On the whole-batch path with
    workers, ``prefetch_factor`` defaults to ``WHOLE_BATCH_PREFETCH``; on the per-sample path with
    ``fields=``, ``collate_fn`` defaults to ``readers.fields.field_collate.FieldCollate`` (targets
    collated as on the whole-batch path), with ``target=`` to ``readers.fields.targets.detection_collate``
    (lists of images and targets).
    """
    if not isinstance(dataset, EpochStream):
        kind = type(dataset).__name__
        raise CallError(f"make_loader takes a dataset from open_iterable or readers.datasets.mix, got {kind}")
    if dataset.batch_size is not None:
        if batch_size is not None:
            raise OptionError(
                f"this iterable already assembles batches of {dataset.batch_size}: leave make_loader's "
                "batch_size out (the loader must not batch them again)"
            )
        if num_workers > 0:
            loader_options.setdefault("prefetch_factor", WHOLE_BATCH_PREFETCH)
    else:
        dataset.set_loader_batch_size(batch_size)
        collate: Any = None
        if batch_size is not None:
            detection = getattr(getattr(dataset, "spec", None), "target", None) is not None
            # lists for detection (images differ in size); fields: default_collate cannot batch them
            collate = detection_collate if detection else field_collate(dataset)
        if collate is not None:
            loader_options.setdefault("collate_fn", collate)
    if loader_options.get("drop_last"):
        raise OptionError("pass drop_last= to open_iterable: it decides for every rank at once")
    return PackedLoader(dataset, batch_size=batch_size, num_workers=num_workers, **loader_options)


__all__ = ["PackedLoader", "WHOLE_BATCH_PREFETCH", "make_loader"]
