"""The order of a token-budget read: batches of one (sequence length, grid) cell, in fixed slots.

A pure function of (seed, epoch, the dataset's stored sizes, the ``TokenBudget``, group, leftover
rule), built like the bucketed schedule (readers/bucketing/bucket_order.py) from the epoch's sample order:

1. each sample gets its cell of the epoch (``TokenPlan.epoch_cells``): which sequence length L it
   is read at varies per epoch, how many samples each cell holds does not;
2. each cell takes its samples in the epoch's order and cuts them into groups of ``group``
   batches of ``budget // L`` (``group``: default the world size, so every rank reads the same
   cell and batch size at each step); the last, short group of a cell holds smaller batches
   (``leftover="shrink"``, the default: ``ceil(rest / group)`` images each, the few missing
   filled with the cell's own first samples of the epoch, so at most ``group - 1`` repeats per
   cell and none with ``group=1``), or is filled to full batches that way (``"pad"``), or is
   left out (``"drop"``: every sample at most once), the last two as for ``AspectBuckets``;
3. the groups of all cells are interleaved so each cell is spread over the epoch.

Batches have different sizes, but readers/order/epoch_order.py deals every rank whole chunks of one ``unit``:
so each batch takes ``slots`` positions (the largest batch size) and a batch of fewer images leaves
the rest ``EMPTY`` (-1), which the reading loop skips (readers/batch/record_stream.py). The schedule is
then an ``OrderSpec`` like any other: every rank, worker and resume rule applies unchanged, a
position counts slots, and an epoch has the same length every time (exact and elastic resume;
a resume with another world size needs the same ``group``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from readers.bucketing.bucket_order import bucket_groups, interleaved, spread_shifts
from readers.bucketing.token_budget import TokenBudget, TokenPlan, token_plan
from readers.errors import OptionError
from readers.order.epoch_order import OrderSpec, global_order, rank_order
from readers.order.resume import ResumeError

EMPTY = -1  # a slot of a batch smaller than the largest: nothing is read there


@dataclass(frozen=True)
class TokenOrder(OrderSpec):
    """An ``OrderSpec`` over the slotted token-budget schedule (``num_samples``: its slots);
    ``unit`` is the slots of one batch."""

    plan: TokenPlan | None = field(default=None, compare=False, repr=False)
    group: int = 1
    leftover: str = "pad"

    def __post_init__(self) -> None:
        if self.group % self.world_size:
            raise OptionError(
                f"TokenBudget group={self.group} is not a multiple of world_size={self.world_size}: "
                "each step of every rank must read one cell; pass group=<a multiple of the world size>"
            )
        if self.unit < int(self.token_plan.cell_batch.max(initial=1)):
            raise OptionError(f"a token-budget read needs unit >= its largest batch, got {self.unit}")
        length = int(self.groups.sum()) * self.group * self.unit
        object.__setattr__(self, "num_samples", length)

    @property
    def token_plan(self) -> TokenPlan:
        assert self.plan is not None
        return self.plan

    @property
    def dataset_size(self) -> int:
        return len(self.token_plan.classes)

    @property
    def groups(self) -> np.ndarray:
        """Groups of ``group`` batches each cell forms in an epoch (the leftover rule applied)."""
        plan = self.token_plan
        return bucket_groups(plan.counts, self.group * plan.cell_batch, self.leftover)

    def base(self, epoch: int) -> np.ndarray:
        return global_order(
            self.dataset_size, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
            block_size=self.block_size, buffer_size=self.buffer_size,
        )  # fmt: skip

    def cells(self, epoch: int) -> np.ndarray:
        """Each sample's cell in ``epoch`` (what the assembler sizes a batch by)."""
        return self.token_plan.epoch_cells(self.base(epoch))

    def schedule(self, epoch: int) -> np.ndarray:
        """Every slot of ``epoch``, in order: sample indices, ``EMPTY`` past a batch's images."""
        plan = self.token_plan
        base = self.base(epoch)
        cells = plan.epoch_cells(base)
        by_cell = base[np.argsort(cells[base], kind="stable")]
        starts = np.cumsum(plan.counts) - plan.counts
        shift = spread_shifts(self.seed, epoch, len(base), len(plan.counts), self.shuffle)
        pieces: list[np.ndarray] = []
        keys: list[np.ndarray] = []
        last_batch = self.last_batch
        for c, k in enumerate(self.groups.tolist()):
            if not k:
                continue
            mine = by_cell[starts[c] : starts[c] + plan.counts[c]]
            batch, last = int(plan.cell_batch[c]), int(last_batch[c])
            full = (k - 1) * self.group * batch  # the last group's batches hold ``last`` images each
            sizes = np.r_[np.full((k - 1) * self.group, batch), np.full(self.group, last)]
            taken = np.resize(mine, full + self.group * last)  # padding: the cell's first samples
            slotted = np.full((k * self.group, self.unit), EMPTY, dtype=np.int64)
            slotted[np.arange(self.unit) < sizes[:, None]] = taken
            pieces.append(slotted.reshape(k, self.group * self.unit))
            keys.append((np.arange(k) + shift[c]) / k)
        return interleaved(pieces, keys)

    @property
    def last_batch(self) -> np.ndarray:
        """Images per batch of each cell's last group: its batch size, or with ``shrink`` what its
        short group needs, spread evenly (``ceil(rest / group)``, padding at most group - 1)."""
        plan = self.token_plan
        if self.leftover != "shrink":
            return plan.cell_batch
        rest = plan.counts - (self.groups - 1) * self.group * plan.cell_batch
        return -(-rest // self.group)

    def epoch_order(self, epoch: int, start: int = 0) -> np.ndarray:
        schedule = self.schedule(epoch)
        return rank_order(schedule, self.rank, self.world_size, self.drop_last, unit=self.unit, start=start)

    def taken_positions(self, epoch: int, start: int, offset: int, samples: int) -> int:
        """The slots of this rank's first batches from (``start``, ``offset``) holding ``samples``
        images: what a plain DataLoader's ``consumed=`` count (images) is in positions."""
        slots = self.epoch_order(epoch, start)[offset:]
        images = np.concatenate([[0], np.cumsum(slots != EMPTY)])
        ends = np.flatnonzero(images == samples)  # a count reached after the last slot of a batch
        whole = ends[(ends + offset) % self.unit == 0] if samples < images[-1] else ends[-1:]
        if samples < 0 or not len(whole):
            raise ResumeError(
                f"consumed={samples} does not end a batch of this rank's token-budget read: pass the "
                "images of the whole batches taken from the loader since iter(loader) began"
            )
        return int(whole[0])

    @property
    def leftovers(self) -> int:
        """Samples padded (``pad``: repeats) or dropped (``drop``) per epoch."""
        plan = self.token_plan
        groups = self.groups
        last = np.where(groups > 0, self.last_batch, 0)
        read = (np.maximum(groups - 1, 0) * plan.cell_batch + last) * self.group
        return abs(int(read.sum()) - self.dataset_size)


def token_order(budget: TokenBudget, sizes: np.ndarray, order: OrderSpec) -> TokenOrder:
    """``order`` (the spec's, for ``sizes`` samples) as the token-budget schedule of ``budget``."""
    group = budget.group if budget.group is not None else order.world_size
    return TokenOrder(
        order.num_samples, order.shuffle, order.seed, order.block_size, order.buffer_size, order.rank,
        order.world_size, order.drop_last, budget.slots, plan=token_plan(budget, sizes), group=group,
        leftover=budget.leftover,
    )  # fmt: skip


def token_summary(budget: TokenBudget, sizes: np.ndarray, world_size: int = 1) -> dict[str, Any]:
    """Per cell its sequence length, pixel size, batch size and samples; the padding or drops."""
    plan = token_plan(budget, sizes)
    order = token_order(budget, sizes, OrderSpec(len(sizes), world_size=world_size))
    return {
        "cells": [
            {"seq_len": budget.seq_lens[budget.cells[c][0]], "size": list(budget.cell_pixels(c)),
             "batch": int(plan.cell_batch[c]), "samples": int(n)}
            for c, n in enumerate(plan.counts.tolist()) if n
        ],  # fmt: skip
        "leftover": budget.leftover,
        "leftovers": order.leftovers,
        "world_size": world_size,
    }
