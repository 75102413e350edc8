#!/usr/bin/env python3
"""Time from ``open_iterable`` to the first batch of a default training read, per checkout.

The read: ``open_iterable(batch_size=64, shuffle=True, crop=RandomResizedCrop(224), flip=True,
fast_dct=True)`` in a ``DataLoader(batch_size=None, num_workers=2, persistent_workers=True)``,
timed from building the iterable to the first batch in hand (imports not counted: each run is a
fresh process that imports first). Checkouts (``--code``, a repository root put first on
PYTHONPATH) take turns, round after round, and the median is reported, so load from other users
of the machine falls on all of them alike.

    pack bench run first_batch W_jpeg.lmdb --code . --code /path/to/other/checkout --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from packer.bench.harness import CODE_ROOT

CHILD = """
import sys, time
from torch.utils.data import DataLoader
from readers import RandomResizedCrop, open_iterable
start = time.perf_counter()
it = open_iterable(sys.argv[1], batch_size=64, shuffle=True, seed=0, fast_dct=True,
                   crop=RandomResizedCrop(224), flip=True)
loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
images, labels = next(iter(loader))
print(time.perf_counter() - start)
"""


def first_batch_seconds(code: Path, dataset: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, os.path.abspath(dataset)],
        env=env,
        cwd=code,  # `python -c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", help="a packed JPEG dataset, e.g. the fastpath suite's W_jpeg.lmdb")
    parser.add_argument("--code", action="append", type=Path, help="a checkout to time (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    codes = [c.resolve() for c in (args.code or [CODE_ROOT])]
    times: dict[Path, list[float]] = {c: [] for c in codes}
    for r in range(args.rounds):
        for code in codes if r % 2 == 0 else codes[::-1]:
            times[code].append(first_batch_seconds(code, args.dataset))
    for code, runs in times.items():
        rounded = ", ".join(f"{t:.3f}" for t in runs)
        print(f"{code}: first batch median {statistics.median(runs):.3f} s (rounds {rounded})")


if __name__ == "__main__":
    main()
