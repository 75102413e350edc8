"""Token-budget reads: samples repeated or left out per epoch by each leftover rule, 1 and 8 ranks.

    pack bench run token_leftovers --n 100000

Counts, not timings: the plan is a function of the stored sizes alone (readers/bucketing/token_order.py),
so this draws ``--n`` ImageNet-like sizes by ``packer/bench/bench_data.py``'s rule (about 500x375:
shorter side x U(0.8, 1.34), ratio x U(0.8, 1.2), one in five portrait) and prints, for
``TokenBudget(patch=16, budget=16384, seq_lens=(128, 256, 576, 784, 1024))``, the cells used and
the leftovers of ``shrink``, ``pad`` and ``drop``.
"""

from __future__ import annotations

import argparse

import numpy as np

from readers import TokenBudget
from readers.bucketing.token_order import token_summary

SEQ_LENS = (128, 256, 576, 784, 1024)


def imagenet_like_sizes(n: int, seed: int = 0) -> np.ndarray:
    """(n, 2) stored (height, width) around 500x375, one in five portrait."""
    rng = np.random.default_rng(seed)
    short = np.round(375 * rng.uniform(0.8, 1.34, n))
    long = np.round(short * 500 / 375 * rng.uniform(0.8, 1.2, n))
    portrait = rng.random(n) < 0.2
    return np.stack([np.where(portrait, long, short), np.where(portrait, short, long)], 1).astype(np.int64)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--budget", type=int, default=16384)
    args = parser.parse_args(argv)
    sizes = imagenet_like_sizes(args.n)
    for leftover in ("shrink", "pad", "drop"):
        budget = TokenBudget(patch=16, budget=args.budget, seq_lens=SEQ_LENS, leftover=leftover)
        for world in (1, 8):
            plan = token_summary(budget, sizes, world)
            share = plan["leftovers"] / max(1, args.n)
            print(f"{leftover:6s} {world} rank(s): {plan['leftovers']:7d} ({share:.2%}) of {args.n} "
                  f"samples, {len(plan['cells'])} cells")  # fmt: skip


if __name__ == "__main__":
    main()
