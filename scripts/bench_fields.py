#!/usr/bin/env python3
"""Batch-path read with a caption and up to 20 boxes per sample vs the same read without fields.

Packs the same JPEGs twice into LMDB (once with the fields ``caption``, ``boxes`` (0-20 per image)
and ``categories``, once without), then reads both with ``open_iterable(batch_size=64,
crop=RandomResizedCrop(224), flip=True)`` through a DataLoader with 2 workers, the fields run with
``fields=["caption", "boxes", "categories"]`` (boxes moved with each crop and flip). Rounds
alternate the order; the median images/s of each and their ratio are printed.

    python scripts/bench_fields.py --images 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from packer.rows import Row, pack_rows
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


def read_rate(path: Path, fields: bool, workers: int) -> float:
    options = {"fields": list(SCHEMA)} if fields else {}
    it = open_iterable(path, batch_size=64, crop=RandomResizedCrop(224), flip=True, seed=0, **options)
    loader = make_loader(it, num_workers=workers)
    start = time.perf_counter()
    seen = sum(images.shape[0] for images, _ in loader)
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-fields-") as tmp:
        root = Path(tmp)
        (root / "imgs").mkdir()
        names = make_images(root / "imgs", args.images, rng)
        classes = [str(k) for k in range(10)]
        plain, rich = root / "plain.lmdb", root / "fields.lmdb"
        pack_rows(rows_for(names, rng, False), root / "imgs", classes, plain, "lmdb", {}, workers=2)
        pack_rows(rows_for(names, rng, True), root / "imgs", classes, rich, "lmdb", SCHEMA, workers=2)
        rates: dict[str, list[float]] = {"without fields": [], "with fields": []}
        for r in range(args.rounds):
            order = [(plain, False), (rich, True)]
            for path, fields in order if r % 2 == 0 else order[::-1]:
                rates["with fields" if fields else "without fields"].append(
                    read_rate(path, fields, args.workers)
                )
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for name, rate in medians.items():
            print(f"{name:15s} {rate:8.0f} images/s (rounds: {', '.join(f'{x:.0f}' for x in rates[name])})")
        print(f"ratio with/without fields: {medians['with fields'] / medians['without fields']:.2f}x")


if __name__ == "__main__":
    main()
