#!/usr/bin/env python3
"""Batch-path read with a caption and up to 20 boxes per sample vs the same read without fields.

Packs the same JPEGs twice into LMDB (once with the fields ``caption``, ``boxes`` (0-20 per image)
and ``categories``, once without), then reads both with ``open_iterable(batch_size=64,
crop=RandomResizedCrop(224), flip=True)`` through a DataLoader with 2 workers, the fields run with
``fields=["caption", "boxes", "categories"]`` (boxes moved with each crop and flip). Each read
keeps its workers for ``--epochs`` timed passes after an untimed one that starts them (the median
pass counts), so worker start-up does not blur the ratio. Rounds alternate the order; the median
images/s of each and their ratio are printed, and the CPU time per image of the loader and its
workers together: on a machine loaded by others that ratio holds where the images/s do not.

    pack bench run fields --images 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from PIL import Image

from packer.scan.rows import Row, pack_rows
from readers import RandomResizedCrop, make_loader, open_iterable

SCHEMA = {"caption": "str", "boxes": "boxes", "categories": "box_ints"}


def make_images(root: Path, count: int, rng: np.random.Generator) -> list[str]:
    names = []
    base = rng.integers(0, 255, (32, 40, 3), dtype=np.uint8)
    for i in range(count):
        small = np.roll(base, i, axis=1)
        # smooth content: JPEG sizes like photos
        image = Image.fromarray(small).resize((320, 256), Image.Resampling.BILINEAR)
        name = f"{i:06d}.jpg"
        image.save(root / name, quality=90)
        names.append(name)
    return names


def rows_for(names: list[str], rng: np.random.Generator, fields: bool) -> list[Row]:
    rows = []
    for i, name in enumerate(names):
        values = {}
        if fields:
            n = int(rng.integers(0, 21))
            xy = rng.uniform(0, 200, (n, 2))
            wh = rng.uniform(5, 100, (n, 2))
            values = {
                "caption": f"image {i}: a synthetic picture with {n} objects",
                "boxes": np.concatenate([xy, wh], axis=1).round(1).tolist(),
                "categories": rng.integers(0, 80, n).tolist(),
            }
        rows.append(Row(name, i % 10, values))
    return rows


def cpu_seconds() -> float:
    """CPU time of this process and its live children (the DataLoader workers) so far."""
    me = psutil.Process()
    total = time.process_time()
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def read_rate(path: Path, fields: bool, workers: int, epochs: int) -> tuple[float, float]:
    """(images/s, CPU microseconds per image of loader and workers together), medians of the
    timed passes."""
    options = {"fields": list(SCHEMA)} if fields else {}
    it = open_iterable(path, batch_size=64, crop=RandomResizedCrop(224), flip=True, seed=0, **options)
    loader = make_loader(it, num_workers=workers, persistent_workers=True)
    rates, costs = [], []
    for _ in range(epochs + 1):  # the first pass starts the workers: not timed
        start, cpu = time.perf_counter(), cpu_seconds()
        seen = sum(images.shape[0] for images, _ in loader)
        rates.append(seen / (time.perf_counter() - start))
        costs.append((cpu_seconds() - cpu) / seen * 1e6)
    return statistics.median(rates[1:]), statistics.median(costs[1:])


def pack_pair(root: Path, count: int, rng: np.random.Generator) -> tuple[Path, Path]:
    """The same ``count`` JPEGs packed into LMDB twice under ``root``: without fields, and with a
    caption and 0-20 boxes per image."""
    (root / "imgs").mkdir()
    names = make_images(root / "imgs", count, rng)
    classes = [str(k) for k in range(10)]
    plain, rich = root / "plain.lmdb", root / "fields.lmdb"
    pack_rows(rows_for(names, rng, False), root / "imgs", classes, plain, "lmdb", {}, workers=2)
    pack_rows(rows_for(names, rng, True), root / "imgs", classes, rich, "lmdb", SCHEMA, workers=2)
    return plain, rich


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3, help="timed passes per read (median)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-fields-") as tmp:
        root = Path(tmp)
        plain, rich = pack_pair(root, args.images, rng)
        rates: dict[str, list[float]] = {"without fields": [], "with fields": []}
        costs: dict[str, list[float]] = {"without fields": [], "with fields": []}
        for r in range(args.rounds):
            order = [(plain, False), (rich, True)]
            for path, fields in order if r % 2 == 0 else order[::-1]:
                name = "with fields" if fields else "without fields"
                rate, cost = read_rate(path, fields, args.workers, args.epochs)
                rates[name].append(rate)
                costs[name].append(cost)
        medians = {k: statistics.median(v) for k, v in rates.items()}
        cpu = {k: statistics.median(v) for k, v in costs.items()}
        for name, rate in medians.items():
            print(
                f"{name:15s} {rate:8.0f} images/s, {cpu[name]:5.0f} CPU us/image "
                f"(rounds: {', '.join(f'{x:.0f}' for x in rates[name])})"
            )
        print(f"ratio with/without fields: {medians['with fields'] / medians['without fields']:.2f}x")
        print(
            "CPU-cost ratio without/with fields (load-robust; the throughput ratio on an idle machine): "
            f"{cpu['without fields'] / cpu['with fields']:.2f}x"
        )


if __name__ == "__main__":
    main()
