"""Which epoch a loader reads next and where it starts: the epoch and resume rules of every loader.

``EpochCursor`` is mixed into ``readers.datasets.stream.EpochStream`` (the ``IterableDataset`` under
``open_iterable`` and ``mix``) and into ``readers.dali._loader.DaliLoader`` (DALI's pipeline, not a
dataset), so both follow one set of rules, written here once:

- each new pass is the next epoch unless the epoch was chosen for it (``set_epoch``, or a loaded
  state's epoch); ``begin_pass`` decides it;
- ``load_state_dict`` checks a state against the order and the dataset (``readers.order.resume``) and
  makes the next pass resume at its point; ``set_epoch`` may then only choose that epoch;
- the state of a loader that reads its whole rank in this process is where its pass stands
  (``Pass.reached``), or where the next pass would start.

The owner sets ``self.order`` (a ``readers.order.epoch_order.OrderSpec``), calls ``init_epochs`` and may
override ``identity`` and ``where``.
"""

from __future__ import annotations

from typing import Any

import torch

from readers.order.epoch_order import OrderSpec
from readers.order.resume import (
    DATASET_VERSION,
    Pass,
    ResumeError,
    ResumePoint,
    check_state,
    checked_epoch,
    make_state,
)


class EpochCursor:
    """The epoch of the next pass, the loaded resume point and the running pass; see the module docstring."""

    order: OrderSpec

    def init_epochs(self, shared: bool = False) -> None:
        """``shared``: the epoch lives in shared memory, so DataLoader workers (fork and spawn,
        persistent ones too) see ``set_epoch``."""
        self._epoch = torch.zeros(1, dtype=torch.int64)
        if shared:
            self._epoch.share_memory_()
        self._resume: ResumePoint | None = None  # set by load_state_dict, used by the next pass
        self._pass: Pass | None = None  # the pass running in this process
        self._chosen = True  # the next pass reads self.epoch as it is (else: the epoch after it)

    def identity(self) -> dict[str, Any]:
        """What besides ``order`` a state must match to resume this loader (an owner adds)."""
        return {}

    def where(self) -> str:
        """The dataset(s) this loader reads, for resume messages."""
        return ""

    # -- the epoch ----------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass (without it, each pass is the next epoch). After
        ``load_state_dict`` only the state's own epoch may be set."""
        epoch = checked_epoch(epoch)
        if self._resume is not None and self._resume.epoch != int(epoch):
            raise ResumeError(
                f"set_epoch({int(epoch)}) contradicts the loaded state, which resumes epoch "
                f"{self._resume.epoch}: call set_epoch({self._resume.epoch}) (or nothing: the epoch "
                "advances by itself), or do not load the state to start epoch "
                f"{int(epoch)} from its beginning"
            )
        self._epoch.fill_(int(epoch))
        self._chosen = True
        self._pass = None

    def begin_pass(self, hand_over: bool = False) -> int:
        """Decide the epoch of the pass that starts now: the chosen one, else the next.

        ``hand_over``: the caller (a loader without workers) decided it for the iteration of this
        process that follows, which must not advance it again."""
        if not self._chosen:
            self._epoch.add_(1)
            self._pass = None
            self._next_pass_begun()
        self._chosen = hand_over
        return self.epoch

    def _next_pass_begun(self) -> None:
        """Called when ``begin_pass`` moves on to the next epoch (an owner resets its counters)."""

    def _next_epoch(self) -> int:
        """The epoch the next pass reads."""
        return self.epoch if self._chosen else self.epoch + 1

    # -- resume -------------------------------------------------------------------------------
    def _pending_resume(self) -> ResumePoint | None:
        resume = self._resume
        return resume if resume is not None and resume.epoch == self._next_epoch() else None

    def pass_start(self, epoch: int) -> ResumePoint:
        """Where a pass over ``epoch`` starts: the loaded state's point in it, else its beginning."""
        resume = self._resume
        return resume if resume is not None and resume.epoch == epoch else ResumePoint(epoch, 0, 0)

    def _start_point(self) -> ResumePoint:
        return ResumePoint(self._next_epoch(), 0, 0)

    def _point_here(self) -> ResumePoint:
        """Where this process stands when it reads the whole rank: in its pass, or at the next one."""
        if self._pass is not None:
            return self._pass.reached(self.order)
        return self._pending_resume() or self._start_point()

    def _state(self, point: ResumePoint) -> dict[str, Any]:
        return make_state(point, self.order, self.identity())

    def _checked_point(self, state: dict[str, Any], in_worker: bool = False) -> ResumePoint:
        """``state``'s resume point, checked against this loader's order and dataset."""
        return check_state(state, self.order, in_worker, self.identity(), self.where())

    def _resume_at(self, point: ResumePoint, in_worker: bool = False) -> None:
        """Make the next pass resume at ``point`` (a worker's state must not move the epoch the
        main process chose)."""
        if not in_worker:
            self._epoch.fill_(point.epoch)
            self._chosen = True
        self._resume = point
        self._pass = None


def dataset_identity(manifest: Any) -> dict[str, Any]:
    """What a state of a read of one packed dataset must match: its samples and its version."""
    version = int(manifest.extra.get("version", 1))  # appends (packer/edit/append.py) count it up
    return {"dataset": manifest.sample_identity(), DATASET_VERSION: version}
