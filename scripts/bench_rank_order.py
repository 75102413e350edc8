#!/usr/bin/env python3
"""What dealing the order to ranks in rounds costs in read locality, against contiguous slices.

Ranks used to read contiguous slices of the epoch's order; they are now dealt it in rounds of one
batch (``readers.order.rank_positions``), which makes the epoch's progress one global position
(elastic resume). This reads rank 0's share of one epoch of a packed dataset both ways, in
process, through the format reader's ``read_many`` in batches, and reports img/s and the number
of contiguous record runs per batch (what a reader can merge into one read).

    python scripts/bench_rank_order.py DATASET --world 4 --batch 64 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer.bench.harness import EpochTimes, time_epoch  # noqa: E402
from readers.formats import open_reader  # noqa: E402
from readers.order import OrderSpec, global_order  # noqa: E402


def contiguous_slice(order: np.ndarray, world: int) -> np.ndarray:
    """Rank 0's share under the old rule: the first of ``world`` equal contiguous slices."""
    per_rank = -(-len(order) // world)
    return order[np.arange(per_rank) % len(order)]


def runs_per_batch(indices: np.ndarray, batch: int) -> float:
    runs = []
    for start in range(0, len(indices), batch):
        part = np.sort(indices[start : start + batch])
        runs.append(1 + int(np.count_nonzero(np.diff(part) != 1)))
    return float(np.mean(runs))


def read_rate(reader, indices: np.ndarray, batch: int) -> float:
    """img/s of one pass over ``indices`` in batches (every record's bytes touched)."""

    def batches():
        for start in range(0, len(indices), batch):
            yield [len(record.data) for record in reader.read_many(indices[start : start + batch])]

    times = EpochTimes(warmup=0)
    time_epoch(batches(), times, time.perf_counter(), count=len)
    return times.rates[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reader = open_reader(args.dataset)
    n = len(reader)
    print(f"{args.dataset}: {n} samples, rank 0 of {args.world}, batches of {args.batch}")
    read_rate(reader, np.arange(n), args.batch)  # warm the page cache: both rules touch every record
    for shuffle in (False, True):
        order = global_order(n, seed=0, epoch=0, shuffle=shuffle, block_size=64, buffer_size=4096)
        old = contiguous_slice(order, args.world)
        spec = OrderSpec(n, shuffle, 0, 64, 4096, 0, args.world, False, args.batch)
        new = spec.epoch_order(0)
        rates: dict[str, list[float]] = {"slices": [], "rounds": []}
        for _ in range(args.rounds):  # interleaved, best of the rounds
            rates["slices"].append(read_rate(reader, old, args.batch))
            rates["rounds"].append(read_rate(reader, new, args.batch))
        best = {k: max(v) for k, v in rates.items()}
        runs = {"slices": runs_per_batch(old, args.batch), "rounds": runs_per_batch(new, args.batch)}
        cells = [f"{k} {best[k]:9.0f} img/s {runs[k]:5.1f} runs/batch" for k in ("slices", "rounds")]
        ratio = best["rounds"] / best["slices"]
        print(f"shuffle={shuffle!s:5}  " + "  ".join(cells) + f"  ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
