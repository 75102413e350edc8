"""The one place where sample order, rank partitioning and worker partitioning are decided.

The order of an epoch is a pure function of (seed, epoch, num_samples, block_size, buffer_size):

1. the samples are cut into contiguous blocks of ``block_size`` and the blocks are permuted, so
   reading stays sequential inside a block;
2. the permuted sequence is cut into windows of whole blocks (``buffer_size`` samples, rounded
   to blocks) and each window is shuffled, which is what a shuffle buffer of that size does,
   but decided up front so it does not depend on who reads what.

The ranks are dealt that global order in rounds of ``unit`` positions each (a batch, or one
sample): rank r takes the r-th chunk of every round. The order is padded by wrapping around (or
cut, with ``drop_last``) so every rank gets the same number of samples. Because ranks consume the
order as a common prefix, one global position says where an epoch stands, and a run can resume
from it with another world size (``rank_positions``). Inside a rank the sequence is cut into the
same chunks and DataLoader worker w takes chunks w, w+W, w+2W...; the DataLoader collects from its
workers round-robin, so it yields the chunks in order whatever the number of workers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np


def global_order(
    num_samples: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int = 1,
    buffer_size: int = 0,
) -> np.ndarray:
    """All sample indices of one epoch, in the order they are consumed (int64)."""
    if not shuffle or num_samples <= 1:
        return np.arange(num_samples, dtype=np.int64)
    block_size = max(1, int(block_size))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, num_samples])
    num_blocks = math.ceil(num_samples / block_size)
    starts = rng.permutation(num_blocks).astype(np.int64) * block_size
    lengths = np.minimum(block_size, num_samples - starts)
    offsets = np.arange(num_samples, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    order = np.repeat(starts, lengths) + offsets
    window = max(1, int(buffer_size) // block_size) * block_size if buffer_size > 0 else 0
    if window > 1:
        window_id = np.arange(num_samples, dtype=np.int64) // window
        order = order[np.lexsort((rng.random(num_samples), window_id))]
    return order


WINDOWS_PER_DRAW = 16  # shuffle windows whose keys order_at draws at once (bounds its memory)


def order_at(
    positions: np.ndarray,
    num_samples: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int = 1,
    buffer_size: int = 0,
) -> np.ndarray:
    """``global_order(...)[positions]`` without building the whole order (int64).

    A rank reads 1/world_size of an epoch: it needs the block permutation (one entry per block)
    and the shuffle keys of the windows its positions fall in, not N-long arrays. The keys are
    the same draws ``global_order`` makes: PCG64 ``advance`` jumps to a window's first key (one
    64-bit step per double), and a stable argsort inside a window is lexsort's order there."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= num_samples):
        raise ValueError(f"positions must lie in [0, {num_samples})")
    if not shuffle or num_samples <= 1:
        return positions.copy()
    block_size = max(1, int(block_size))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, num_samples])
    num_blocks = math.ceil(num_samples / block_size)
    permuted = rng.permutation(num_blocks).astype(np.int64)
    window = max(1, int(buffer_size) // block_size) * block_size if buffer_size > 0 else 0
    if window > 1:
        positions = _window_sources(positions, num_samples, window, rng.bit_generator.state)
    return _block_order_at(positions, permuted, num_samples, block_size)


def _block_order_at(positions: np.ndarray, permuted: np.ndarray, num_samples: int, block: int) -> np.ndarray:
    """The block-permuted sequence at ``positions``. Only the last source block may be short;
    positions past it (in permuted order) are shifted by what it lacks."""
    short = block - (num_samples - (len(permuted) - 1) * block)
    if short:
        end = (int(np.flatnonzero(permuted == len(permuted) - 1)[0]) + 1) * block - short
        positions = positions + np.where(positions >= end, short, 0)
    return permuted[positions // block] * block + positions % block


def _window_sources(positions: np.ndarray, num_samples: int, window: int, state: Any) -> np.ndarray:
    """Where each position's sample sits before its window was shuffled."""
    out = np.empty_like(positions)
    windows = positions // window
    per_draw = WINDOWS_PER_DRAW * window
    for first in np.unique(windows // WINDOWS_PER_DRAW * per_draw).tolist():
        bits = np.random.PCG64()
        bits.state = state
        keys = np.random.Generator(bits.advance(first)).random(min(per_draw, num_samples - first))
        here = np.flatnonzero((positions >= first) & (positions < first + per_draw))
        # the last window of the epoch may be short: pad its keys past every real one
        if len(keys) % window:
            keys = np.concatenate([keys, np.full(-len(keys) % window, 2.0)])
        keys = keys.reshape(-1, window)
        needed, row = np.unique(windows[here] - first // window, return_inverse=True)
        ranks = np.argsort(keys[needed], axis=1, kind="stable")
        out[here] = windows[here] * window + ranks[row, positions[here] % window]
    return out


PACK_ORDERS = ("shuffled", "source")
PACK_STREAM = 0x5041434B  # "PACK": the pack's permutation is drawn apart from every epoch's order


def pack_order(num_items: int, kind: str = "shuffled", seed: int = 0) -> np.ndarray:
    """The source positions in the order a pack writes them (int64): a seeded permutation
    (``shuffled``, the default, so block-wise reads of a class-sorted source still mix classes)
    or the source order itself (``source``)."""
    if kind not in PACK_ORDERS:
        raise ValueError(f"order {kind!r}; use one of {', '.join(PACK_ORDERS)}")
    if kind == "source" or num_items <= 1:
        return np.arange(num_items, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, num_items, PACK_STREAM])
    return rng.permutation(num_items).astype(np.int64)


def rank_positions(
    num_samples: int,
    rank: int,
    world_size: int,
    drop_last: bool = False,
    *,
    unit: int = 1,
    start: int = 0,
) -> np.ndarray:
    """Positions of the epoch's order that ``rank`` reads, from global position ``start`` on.

    The positions ``[start, start + total)`` are dealt to the ranks in rounds: in each round
    rank r takes the r-th run of ``unit`` positions (a batch, or one sample). The last, short
    round is split evenly. So after every rank has taken k chunks, the whole job has consumed
    exactly the prefix ``[start, start + k * world_size * unit)``: one number says where an epoch
    stands, whatever the world size (elastic resume).

    ``total`` makes the ranks equal: without ``drop_last`` the remaining samples are padded by
    wrapping around the order to a multiple of ``world_size`` (positions past the end map to
    ``position % num_samples``); with ``drop_last`` they are cut to whole rounds of ``unit``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    if unit < 1:
        raise ValueError(f"unit must be a positive integer, got {unit}")
    if not 0 <= start <= num_samples:
        raise ValueError(f"start position {start} is outside the epoch of {num_samples} samples")
    total = epoch_total(num_samples, world_size, drop_last, unit=unit, start=start)
    round_size = world_size * unit
    full_rounds = total // round_size
    tail = (total - full_rounds * round_size) // world_size
    full = (np.arange(full_rounds, dtype=np.int64)[:, None] * round_size + rank * unit) + np.arange(unit)
    last = full_rounds * round_size + rank * tail + np.arange(tail, dtype=np.int64)
    return start + np.concatenate([full.ravel(), last])


def epoch_total(num_samples: int, world_size: int, drop_last: bool, *, unit: int = 1, start: int = 0) -> int:
    """Positions all ranks read together from ``start`` to the end of the epoch (see rank_positions)."""
    remaining = max(0, num_samples - start)
    if drop_last:
        return remaining // (world_size * unit) * (world_size * unit)
    return math.ceil(remaining / world_size) * world_size


def rank_order(
    order: np.ndarray, rank: int, world_size: int, drop_last: bool, *, unit: int = 1, start: int = 0
) -> np.ndarray:
    """This rank's samples, in order; padded by wrapping around the global order if needed."""
    positions = rank_positions(len(order), rank, world_size, drop_last, unit=unit, start=start)
    return order[positions % len(order)] if len(order) else order[:0]


def consumed_position(
    num_samples: int, world_size: int, drop_last: bool, *, unit: int, start: int, chunks: int
) -> int:
    """The global position reached when every rank has taken ``chunks`` chunks since ``start``."""
    total = epoch_total(num_samples, world_size, drop_last, unit=unit, start=start)
    return min(num_samples, start + min(total, chunks * world_size * unit))


def num_chunks(num_positions: int, chunk: int, drop_last: bool) -> int:
    return num_positions // chunk if drop_last else math.ceil(num_positions / chunk)


def worker_chunks(num_positions: int, chunk: int, worker: int, num_workers: int, drop_last: bool):
    """(start, stop) positions of the chunks that DataLoader worker ``worker`` produces, in order."""
    for c in range(worker, num_chunks(num_positions, chunk, drop_last), num_workers):
        yield c * chunk, min((c + 1) * chunk, num_positions)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size from the arguments, else torch.distributed, else RANK/WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (
                dist.get_world_size() if world_size is None else world_size
            )
    except ImportError:
        pass
    env_rank = int(os.environ.get("RANK", "0"))
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    return (env_rank if rank is None else rank), (env_world if world_size is None else world_size)


@dataclass(frozen=True)
class OrderSpec:
    """Everything the order of an epoch depends on, besides the epoch itself."""

    num_samples: int
    shuffle: bool = True
    seed: int = 0
    block_size: int = 1
    buffer_size: int = 0
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    unit: int = 1  # positions a rank takes per turn: its batch size, or 1

    def at_epoch(self, epoch: int) -> OrderSpec:
        """This order with ``num_samples`` counting ``epoch``: itself, unless the length changes by
        epoch (a bucketed order with ``leftover="carry"`` or over a mix,
        readers/bucketing/bucket_order.py)."""
        return self

    def epoch_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's sample indices for ``epoch``, from global position ``start`` on."""
        if self.num_samples == 0:
            return np.zeros(0, dtype=np.int64)
        positions = rank_positions(
            self.num_samples, self.rank, self.world_size, self.drop_last, unit=self.unit, start=start
        )
        return order_at(
            positions % self.num_samples,
            self.num_samples,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            block_size=self.block_size,
            buffer_size=self.buffer_size,
        )

    @property
    def samples_per_rank(self) -> int:
        """Samples this rank reads in a whole epoch."""
        return self.samples_from(0)

    def samples_from(self, start: int) -> int:
        """Samples this rank reads from global position ``start`` to the end of the epoch."""
        total = epoch_total(self.num_samples, self.world_size, self.drop_last, unit=self.unit, start=start)
        return total // self.world_size

    def taken_positions(self, epoch: int, start: int, offset: int, samples: int) -> int:
        """Positions this rank has read once it has taken ``samples`` samples of ``epoch`` from
        (``start``, ``offset``): the same number here; a slotted order counts its empty slots."""
        return samples

    def position_after(self, chunks: int, start: int = 0) -> int:
        """Global position once every rank has taken ``chunks`` chunks of ``unit`` since ``start``."""
        return consumed_position(
            self.num_samples, self.world_size, self.drop_last, unit=self.unit, start=start, chunks=chunks
        )
