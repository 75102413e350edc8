"""The order of a bucketed read: the epoch's samples as batches of one bucket each.

A pure function of (seed, epoch, the dataset's bucket of each sample, batch size, group,
leftover rule), built from the epoch's sample order (``readers.order.epoch_order.global_order``):

1. each bucket takes its samples in the epoch's order and cuts them into *groups* of
   ``group x batch`` samples: ``group`` batches of that bucket in a row (default: the world size,
   so the ranks, dealt whole batches in rounds by ``readers.order.epoch_order``, read one bucket at
   each step);
2. a bucket's last, short group is filled with the bucket's own first samples of the epoch
   (``leftover="pad"``, the default: every sample at least once, each batch full), left out
   (``leftover="drop"``: every sample at most once; another set each epoch, as the order changes)
   or carried (``leftover="carry"``, ``carry_schedule``: each bucket's epochs form one stream, and
   an epoch reads the groups that end among its own samples, so the short group's samples are
   read first in that bucket's next epoch: nothing padded or dropped, every sample of each
   epoch's order read exactly once, fewer than ``group x batch`` per bucket waiting at any time;
   the epoch's length changes by up to a group per bucket, so ``len()`` does too);
3. the groups of all buckets are interleaved so each bucket is spread over the epoch: group j
   of a bucket with k groups sits at (j + u) / k, u drawn per bucket and epoch (0.5 without
   shuffle), ties by bucket.

The result is a permutation-with-padding of the samples whose ``batch``-aligned spans are
batches, so ``BucketOrder`` is an ``OrderSpec`` of that length and every rank, worker and
resume rule of readers/order/epoch_order.py and readers/order/resume.py applies unchanged: a position is a
position in this schedule (with ``carry``, of that epoch's schedule: ``OrderSpec.at_epoch``).
A resume with another world size needs the same ``group`` (pass ``group=`` when a run may change
its world size: any world size dividing it works).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from readers.errors import OptionError
from readers.order.epoch_order import OrderSpec, global_order, rank_order

BUCKET_STREAM = 0x4255434B  # "BUCK": the spread's draws apart from the epoch's order


def bucket_groups(counts: np.ndarray, group_size: int | np.ndarray, leftover: str) -> np.ndarray:
    """Groups of ``group_size`` samples each bucket forms in an epoch (the leftover rule applied)."""
    if leftover == "drop":
        return counts // group_size
    return -(-counts // group_size)


def bucket_schedule(
    bucket_ids: np.ndarray,
    num_buckets: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    block_size: int,
    buffer_size: int,
    group_size: int,
    leftover: str,
) -> np.ndarray:
    """Sample indices of one epoch, in the order read: ``group_size`` runs of one bucket each."""
    n = len(bucket_ids)
    base = global_order(
        n, seed=seed, epoch=epoch, shuffle=shuffle, block_size=block_size, buffer_size=buffer_size
    )
    shift = spread_shifts(seed, epoch, n, num_buckets, shuffle)
    return grouped(base, bucket_ids[base], num_buckets, group_size, leftover, shift)


def grouped(
    items: np.ndarray, ids: np.ndarray, num_buckets: int, group_size: int, leftover: str, shift: np.ndarray
) -> np.ndarray:
    """``items`` (in the epoch's order, of buckets ``ids``) cut per bucket into groups of
    ``group_size`` (the short last one padded or dropped), the groups spread by ``shift``."""
    # each bucket's items in the epoch's order (stable sort keeps that order inside a bucket)
    by_bucket = items[np.argsort(ids, kind="stable")]
    counts = np.bincount(ids, minlength=num_buckets)
    groups = bucket_groups(counts, group_size, leftover)
    pieces: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    start = 0
    for b in range(num_buckets):
        mine = by_bucket[start : start + counts[b]]
        start += counts[b]
        k = int(groups[b])
        if not k:
            continue
        pieces.append(np.resize(mine, k * group_size).reshape(k, group_size))
        keys.append((np.arange(k) + shift[b]) / k)
    return interleaved(pieces, keys)


def spread_shifts(seed: int, epoch: int, n: int, num_buckets: int, shuffle: bool) -> np.ndarray:
    """Each bucket's place u in [0, 1) of its first group in the epoch (0.5 without shuffle)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, n, BUCKET_STREAM])
    return rng.random(num_buckets) if shuffle else np.full(num_buckets, 0.5)


def interleaved(pieces: list[np.ndarray], keys: list[np.ndarray]) -> np.ndarray:
    """The groups of every bucket (``pieces``, one (k, group) array each) in order of their
    ``keys`` (ties by bucket), as one sequence of sample indices."""
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    owner = np.concatenate([np.full(len(p), i) for i, p in enumerate(pieces)])
    return np.concatenate(pieces)[np.lexsort((owner, np.concatenate(keys)))].reshape(-1).astype(np.int64)


@dataclass(frozen=True)
class BucketOrder(OrderSpec):
    """An ``OrderSpec`` over the bucketed schedule: ``num_samples`` is the schedule's length.

    ``bucket_ids``: each sample's bucket; ``group``: batches of one bucket in a row; ``unit``
    is the batch size (the schedule is rebuilt for the unit a loader sets). ``length_epoch``: the
    epoch ``num_samples`` counts, when the length changes by epoch (``leftover="carry"``): every
    user of the length asks ``at_epoch(epoch)`` first (readers/datasets/stream.py,
    readers/order/resume.py)."""

    bucket_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)
    num_buckets: int = 1
    group: int = 1
    leftover: str = "pad"
    length_epoch: int = 0

    def __post_init__(self) -> None:
        if self.group % self.world_size:
            raise OptionError(
                f"buckets group={self.group} is not a multiple of world_size={self.world_size}: each "
                "step of every rank must read one bucket; pass group=<a multiple of the world size>"
            )
        object.__setattr__(self, "num_samples", self.epoch_length(self.length_epoch))

    @property
    def dataset_size(self) -> int:
        return len(self.bucket_ids)

    @property
    def group_size(self) -> int:
        return self.group * self.unit

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.bucket_ids, minlength=self.num_buckets)

    def epoch_counts(self, epoch: int) -> np.ndarray:
        """Samples of each bucket in ``epoch``'s order (a dataset's: the same every epoch)."""
        return self.counts

    def epoch_length(self, epoch: int) -> int:
        """Positions of ``epoch``'s schedule, all ranks together."""
        counts = self.epoch_counts(epoch)
        if self.leftover == "carry":
            return carry_length(counts, self.group_size, epoch)
        return int(bucket_groups(counts, self.group_size, self.leftover).sum()) * self.group_size

    @property
    def varies(self) -> bool:
        """Whether the schedule's length changes from epoch to epoch."""
        return self.leftover == "carry"

    def at_epoch(self, epoch: int) -> BucketOrder:
        if not self.varies or epoch == self.length_epoch:
            return self
        return replace(self, length_epoch=int(epoch))

    def schedule(self, epoch: int) -> np.ndarray:
        options = dict(seed=self.seed, epoch=epoch, shuffle=self.shuffle, block_size=self.block_size,
                       buffer_size=self.buffer_size, group_size=self.group_size)  # fmt: skip
        if self.leftover == "carry":
            return carry_schedule(self.bucket_ids, self.num_buckets, **options)  # type: ignore[arg-type]
        return bucket_schedule(self.bucket_ids, self.num_buckets, leftover=self.leftover, **options)  # type: ignore[arg-type]

    def epoch_order(self, epoch: int, start: int = 0) -> np.ndarray:
        schedule = self.schedule(epoch)
        return rank_order(schedule, self.rank, self.world_size, self.drop_last, unit=self.unit, start=start)

    @property
    def leftovers(self) -> int:
        """Samples padded (``pad``: repeats) or dropped (``drop``) per epoch; none with ``carry``."""
        return 0 if self.leftover == "carry" else abs(self.num_samples - self.dataset_size)


def carry_schedule(
    bucket_ids: np.ndarray,
    num_buckets: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    block_size: int,
    buffer_size: int,
    group_size: int,
) -> np.ndarray:
    """The schedule of ``leftover="carry"``: a bucket's short group waits for the next epoch.

    Each bucket's samples, epoch after epoch in each epoch's order (as ``bucket_schedule`` takes
    them), form one endless stream cut into groups of ``group_size``; an epoch reads the groups that
    *end* among its own samples. So nothing is padded or dropped: every sample of epoch e's order
    is read exactly once, in epoch e or, for the last < ``group_size`` samples of a bucket, in a
    later epoch (the next one unless the bucket holds fewer than ``group_size`` samples); after E
    epochs fewer than ``group_size`` samples per bucket are still waiting. The epoch's length
    varies by epoch (``carry_length``). A pure function of (seed, epoch, the buckets): it looks
    back at most ``ceil(group_size / smallest bucket)`` epochs' orders."""
    n = len(bucket_ids)
    counts = np.bincount(bucket_ids, minlength=num_buckets)
    members: dict[int, list[np.ndarray]] = {}

    def own(e: int, b: int) -> np.ndarray:  # bucket b's samples in epoch e's order
        if e not in members:
            base = global_order(
                n, seed=seed, epoch=e, shuffle=shuffle, block_size=block_size, buffer_size=buffer_size
            )
            of_base = bucket_ids[base]
            members[e] = [base[of_base == k] for k in range(num_buckets)]
        return members[e][b]

    shift = spread_shifts(seed, epoch, n, num_buckets, shuffle)
    pieces: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    for b in range(num_buckets):
        size = int(counts[b])
        first, stop = epoch * size // group_size, (epoch + 1) * size // group_size
        if stop <= first:
            continue
        stream = np.arange(first * group_size, stop * group_size, dtype=np.int64)
        picks = np.empty_like(stream)
        for e in np.unique(stream // size).tolist():
            here = stream // size == e
            picks[here] = own(int(e), b)[stream[here] % size]
        k = stop - first
        pieces.append(picks.reshape(k, group_size))
        keys.append((np.arange(k) + shift[b]) / k)
    return interleaved(pieces, keys)


def carry_length(counts: np.ndarray, group_size: int, epoch: int) -> int:
    """Samples in epoch ``epoch`` of a ``leftover="carry"`` schedule (all ranks together)."""
    counts = np.asarray(counts, dtype=np.int64)
    groups = (epoch + 1) * counts // group_size - epoch * counts // group_size
    return int(groups.sum()) * group_size
