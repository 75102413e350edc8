"""The one place where sample order, rank partitioning and worker partitioning are decided.

The order of an epoch is a pure function of (seed, epoch, num_samples, block_size, buffer_size):

1. the samples are cut into contiguous blocks of ``block_size`` and the blocks are permuted, so
   reading stays sequential inside a block;
2. the permuted sequence is cut into windows of whole blocks (``buffer_size`` samples, rounded
   to blocks) and each window is shuffled, which is what a shuffle buffer of that size does,
   but decided up front so it does not depend on who reads what.

That global order is padded by wrapping around (or cut, with ``drop_last``) to a multiple of the
world size, and rank r takes the r-th contiguous slice, so the global order is the same for any
world size and every rank gets the same number of samples. Inside a rank the sequence is cut into
chunks (a batch, or one sample) and DataLoader worker w takes chunks w, w+W, w+2W...; the
DataLoader collects from its workers round-robin, so it yields the chunks in order whatever the
number of workers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

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


def rank_slice(num_samples: int, rank: int, world_size: int, drop_last: bool) -> tuple[int, int]:
    """Positions [start, stop) of the (wrapped) global order that belong to ``rank``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    per_rank = num_samples // world_size if drop_last else math.ceil(num_samples / world_size)
    return rank * per_rank, (rank + 1) * per_rank


def rank_order(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """This rank's samples, in order; padded by wrapping around the global order if needed."""
    start, stop = rank_slice(len(order), rank, world_size, drop_last)
    if stop <= len(order):
        return order[start:stop]
    return order[np.arange(start, stop) % len(order)] if len(order) else order[:0]


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

    def epoch_order(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for ``epoch``."""
        order = global_order(
            self.num_samples,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            block_size=self.block_size,
            buffer_size=self.buffer_size,
        )
        return rank_order(order, self.rank, self.world_size, self.drop_last)

    @property
    def samples_per_rank(self) -> int:
        start, stop = rank_slice(self.num_samples, self.rank, self.world_size, self.drop_last)
        return stop - start
