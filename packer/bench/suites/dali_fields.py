#!/usr/bin/env python3
"""DALI read with a caption and up to 20 boxes per sample vs the same read without fields.

The data of ``packer/bench/suites/fields.py`` (the same JPEGs packed twice into LMDB, with and without
the fields ``caption``, ``boxes`` (0-20 per image) and ``categories``), read by ``dali_loader``
(``--device``: ``auto`` takes the GPU where there is one, else DALI's CPU pipeline) with
``crop=RandomResizedCrop(224), flip=True``, the fields run with ``fields=["caption", "boxes",
"categories"]`` (boxes moved in this process by each window and flip). Rounds alternate the
order; the median images/s of each, their ratio and the milliseconds per batch this process
spent building the targets (``readers.dali._fields.DaliFields.target``) are printed.

    pack bench run dali_fields --images 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from packer.bench.suites.fields import SCHEMA, pack_pair
from readers import RandomResizedCrop
from readers.dali import dali_loader


def read_rate(path: Path, fields: bool, args: argparse.Namespace) -> tuple[float, float]:
    """(images/s, ms per batch in DaliFields.target) of one epoch after a warm-up epoch."""
    options: dict[str, Any] = {"fields": list(SCHEMA)} if fields else {}
    loader = dali_loader(
        path, batch_size=args.batch_size, device=args.device, crop=RandomResizedCrop(224), flip=True,
        num_threads=args.threads or os.cpu_count(), py_workers=args.py_workers, pad_last=False, **options,
    )  # fmt: skip
    spent = [0.0]
    carried: Any = getattr(loader, "fields", None)  # DaliLoader's DaliFields (None without fields)
    if carried is not None:
        target = carried.target

        def timed(*a: Any) -> Any:
            start = time.perf_counter()
            out = target(*a)
            spent[0] += time.perf_counter() - start
            return out

        carried.target = timed
    for _ in loader:  # warm-up: pipeline build, page cache
        pass
    spent[0] = 0.0
    start = time.perf_counter()
    seen = batches = 0
    for images, _ in loader:
        seen += images.shape[0]
        batches += 1
    if loader.backend == "dali-gpu":
        import torch

        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start), 1000 * spent[0] / max(1, batches)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="auto", help="auto, gpu or cpu (dali_loader's device=)")
    parser.add_argument("--threads", type=int, default=None, help="DALI threads (default: every CPU)")
    parser.add_argument("--py-workers", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-dali-fields-") as tmp:
        root = Path(tmp)
        plain, rich = pack_pair(root, args.images, rng)
        rates: dict[str, list[float]] = {"without fields": [], "with fields": []}
        target_ms: list[float] = []
        for r in range(args.rounds):
            order = [(plain, False), (rich, True)]
            for path, fields in order if r % 2 == 0 else order[::-1]:
                rate, ms = read_rate(path, fields, args)
                rates["with fields" if fields else "without fields"].append(rate)
                if fields:
                    target_ms.append(ms)
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for name, rate in medians.items():
            print(f"{name:15s} {rate:8.0f} images/s (rounds: {', '.join(f'{x:.0f}' for x in rates[name])})")
        print(f"ratio with/without fields: {medians['with fields'] / medians['without fields']:.2f}x")
        per_sample = 1000 * statistics.median(target_ms) / args.batch_size
        print(f"targets built in this process: {statistics.median(target_ms):.2f} ms per batch "
              f"({per_sample:.1f} us per sample)")  # fmt: skip


if __name__ == "__main__":
    main()
