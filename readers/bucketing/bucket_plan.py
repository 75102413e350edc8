"""A dataset's bucket plan: each sample's stored size and bucket, the bucketed order, a summary.

The manifest records only the range of stored sizes, so the plan reads each record's stored
height and width once, when a bucketed iterable is built (in the process that builds it: the
DataLoader workers get the plan with the iterable). Nothing is decoded: every format's records
carry their size (the LMDB header, HDF5's ``shapes``, the BMP index, the tar/TFRecord header
parse).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from readers.bucketing.bucket_order import BucketOrder, bucket_groups, carry_length
from readers.bucketing.buckets import Buckets, kept_fraction, square_kept_fraction
from readers.bucketing.token_budget import TokenBudget
from readers.bucketing.token_order import TokenOrder, token_order
from readers.order.epoch_order import OrderSpec
from readers.order.resume import ResumeError

SCAN_BLOCK = 1024


def sample_sizes(reader: Any) -> np.ndarray:
    """(N, 2) int64 stored (height, width) of every sample of ``reader``, in index order."""
    n = len(reader)
    out = np.zeros((n, 2), dtype=np.int64)
    for start in range(0, n, SCAN_BLOCK):
        records = reader.read_block(start, min(n, start + SCAN_BLOCK))
        out[start : start + len(records)] = [(r.height, r.width) for r in records]
    return out


def bucket_order(
    buckets: Buckets | TokenBudget, sizes: np.ndarray, order: OrderSpec, batch: int
) -> OrderSpec:
    """``order`` (the spec's, for ``sizes`` samples) as the bucketed schedule of ``batch`` batches
    (a token budget: its own batch sizes, readers/bucketing/token_order.py)."""
    if isinstance(buckets, TokenBudget):
        return token_order(buckets, sizes, order)
    ids = buckets.assign(sizes[:, 0], sizes[:, 1])
    group = buckets.group if buckets.group is not None else order.world_size
    return BucketOrder(
        order.num_samples, order.shuffle, order.seed, order.block_size, order.buffer_size, order.rank,
        order.world_size, order.drop_last, batch, bucket_ids=ids, num_buckets=len(buckets.sizes),
        group=group, leftover=buckets.leftover,
    )  # fmt: skip


def summary(buckets: Buckets, sizes: np.ndarray, batch: int, world_size: int = 1) -> dict[str, Any]:
    """The histogram a bucket option gives ``sizes`` and what it keeps: per bucket its size and
    samples, the mean fraction of each image's area kept (bucketed, and by a square centre crop),
    and the samples padded or dropped per epoch with ``batch`` and ``world_size`` ranks (with
    ``leftover="carry"`` none: ``carried`` counts those epoch 0 leaves to epoch 1)."""
    ids = buckets.assign(sizes[:, 0], sizes[:, 1])
    counts = np.bincount(ids, minlength=len(buckets.sizes))
    group = (buckets.group or world_size) * batch
    if buckets.leftover == "carry":  # nothing padded or dropped: the short groups wait for epoch 1
        length = len(sizes)
        carried = len(sizes) - carry_length(counts, group, 0)
    else:
        length = int(bucket_groups(counts, group, buckets.leftover).sum()) * group
        carried = 0
    pairs = [(int(h), int(w)) for h, w in sizes.tolist()]
    kept = [kept_fraction(s, buckets.sizes[b]) for s, b in zip(pairs, ids.tolist())]
    return {
        "buckets": [
            {"size": list(size), "samples": int(c)} for size, c in zip(buckets.sizes, counts.tolist()) if c
        ],
        "kept": float(np.mean(kept)) if kept else 0.0,
        "kept_square": float(np.mean([square_kept_fraction(s) for s in pairs])) if pairs else 0.0,
        "leftover": buckets.leftover,
        "leftovers": abs(length - len(pairs)),
        "carried": carried,
        "batch_size": batch,
        "world_size": world_size,
    }


def bucket_identity(spec: Any, order: OrderSpec) -> dict[str, str]:
    """What a resume state of a bucketed read must match besides the order (none unbucketed)."""
    if spec.buckets is None or not isinstance(order, (BucketOrder, TokenOrder)):
        return {}
    return {"buckets": spec.buckets.key(order.group)}


def check_bucket_state(state: Any, mine: dict[str, str], where: str) -> None:
    """Refuse, before the order's own checks, a state of another bucket plan (or none), naming the fix."""
    if not isinstance(state, dict) or state.get("buckets") == mine.get("buckets"):
        return
    raise ResumeError(
        f"cannot resume {where}: the state was saved with buckets {state.get('buckets')!r} but this "
        f"stream reads buckets {mine.get('buckets')!r}; pass the same buckets (a run that changes its "
        "world size needs the same group=, e.g. AspectBuckets(..., group=8) for 1, 2, 4 or 8 ranks)"
    )
