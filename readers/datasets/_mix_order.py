"""The order of a mix (readers/datasets/mix.py): which dataset and sample each position of an epoch reads,
and, with ``buckets=``, that sequence cut into batches of one bucket each.

``MixSequence`` is the mix's epoch: a function of (seed, epoch, the datasets' sizes, their quotas,
block and buffer sizes, shuffle) only, so a worker, rank or resumed run rebuilds it alone.

``MixBucketOrder`` buckets it. Each position of the epoch holds one sample of one dataset, whose
bucket is a function of its stored size (``readers.bucketing.bucket_plan.sample_sizes``); the positions, in
the mixed order, are cut per bucket into groups of ``group x batch`` and the groups spread over
the epoch exactly as one dataset's samples are (``readers.bucketing.bucket_order.grouped``, the spread
always drawn: the mix's interleaving is seeded even with ``shuffle=False``). So the bucketed epoch
stays a pure function of (seed, epoch, datasets, weights), every position of the mixed epoch is
read once (``pad``: the short group of a bucket filled with its first positions; ``drop``: left
out), and the rank, worker and resume rules of readers/order/epoch_order.py apply to positions of this
schedule. Which samples land in a bucket changes by epoch, so its counts, and the schedule's
length, do: ``at_epoch`` gives the order of an epoch's length. ``leftover="carry"`` is refused:
carrying a mix's short groups would need every earlier epoch's bucket counts (they change by
epoch), and the mix already carries each dataset's stream from epoch to epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from readers.bucketing.bucket_order import BucketOrder, grouped, spread_shifts
from readers.errors import OptionError
from readers.order.epoch_order import OrderSpec, global_order

MIX_TAG = 0x6D6978  # "mix": keeps the interleaving stream apart from the datasets' own orders


@dataclass(frozen=True)
class MixSequence:
    """(dataset index, sample index) of every position of a mix's epoch, all ranks together."""

    seed: int
    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    block_size: int
    buffer_size: int
    shuffle: bool

    @property
    def epoch_size(self) -> int:
        return int(sum(self.counts))

    def dataset_seed(self, i: int) -> int:
        return int(np.random.SeedSequence([self.seed & 0xFFFFFFFF, i, MIX_TAG]).generate_state(1)[0])

    def __call__(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        last = self.__dict__.get("_last")  # the order, the reads and len() ask for one epoch in turn
        if last is None or last[0] != epoch:
            last = (epoch, *self.build(epoch))
            object.__setattr__(self, "_last", last)
        return last[1], last[2]

    def build(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        key = [self.seed & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, self.epoch_size, MIX_TAG]
        rng = np.random.default_rng(key)
        source = rng.permutation(np.repeat(np.arange(len(self.sizes)), self.counts))
        index = np.empty(self.epoch_size, dtype=np.int64)
        for i, (n, count) in enumerate(zip(self.sizes, self.counts)):
            stream = np.arange(epoch * count, (epoch + 1) * count, dtype=np.int64)  # dataset i's stream
            picks = np.empty(count, dtype=np.int64)
            for k in np.unique(stream // n).tolist():  # each pass over dataset i has its own order
                order = global_order(
                    n, seed=self.dataset_seed(i), epoch=k, block_size=self.block_size,
                    buffer_size=self.buffer_size, shuffle=self.shuffle,
                )  # fmt: skip
                here = stream // n == k
                picks[here] = order[stream[here] % n]
            index[source == i] = picks
        return source, index


@dataclass(frozen=True)
class MixBucketOrder(BucketOrder):
    """``BucketOrder`` over the positions of a mixed epoch: ``dataset_buckets`` holds each
    dataset's bucket of every sample; ``sequence`` the mix's epoch."""

    dataset_buckets: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)
    sequence: MixSequence | None = field(default=None, compare=False, repr=False)

    def position_buckets(self, epoch: int) -> np.ndarray:
        """The bucket of the sample at each position of ``epoch``'s mixed sequence."""
        assert self.sequence is not None
        source, index = self.sequence(epoch)
        ids = np.empty(len(source), dtype=np.int64)
        for i, buckets in enumerate(self.dataset_buckets):
            mine = source == i
            ids[mine] = buckets[index[mine]]
        return ids

    def epoch_counts(self, epoch: int) -> np.ndarray:
        return np.bincount(self.position_buckets(epoch), minlength=self.num_buckets)

    @property
    def varies(self) -> bool:
        return True

    @property
    def dataset_size(self) -> int:
        return self.sequence.epoch_size if self.sequence is not None else 0

    def schedule(self, epoch: int) -> np.ndarray:
        ids = self.position_buckets(epoch)
        positions = np.arange(len(ids), dtype=np.int64)
        shift = spread_shifts(self.seed, epoch, len(ids), self.num_buckets, True)
        return grouped(positions, ids, self.num_buckets, self.group_size, self.leftover, shift)


def mix_bucket_order(
    buckets: Any, sizes: list[np.ndarray], sequence: MixSequence, order: OrderSpec, batch: int
) -> MixBucketOrder:
    """The bucketed order of a mix: ``buckets`` (a ``readers.bucketing.buckets`` option), ``sizes`` each
    dataset's stored (height, width) per sample, ``order`` the mix's unbucketed order."""
    from readers.bucketing.token_budget import TokenBudget

    if isinstance(buckets, TokenBudget):
        raise OptionError(
            "mix(buckets=TokenBudget(...)) is not supported: a token budget reads one dataset "
            "(open_iterable); give mix AspectBuckets(...) or a list of (H, W) buckets"
        )
    if buckets.leftover == "carry":
        raise OptionError(
            "mix(buckets=...) takes leftover='pad' or 'drop': a mix's buckets change by epoch, so "
            "its short groups cannot be carried; use leftover='carry' with open_iterable"
        )
    group = buckets.group if buckets.group is not None else order.world_size
    return MixBucketOrder(
        order.num_samples, order.shuffle, order.seed, order.block_size, order.buffer_size, order.rank,
        order.world_size, order.drop_last, batch, num_buckets=len(buckets.sizes), group=group,
        leftover=buckets.leftover, dataset_buckets=tuple(buckets.assign(s[:, 0], s[:, 1]) for s in sizes),
        sequence=sequence,
    )  # fmt: skip
