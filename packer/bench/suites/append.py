"""Append benchmark: adding a few % to a pack against a full pack, and the appended dataset's read
rate against a fresh pack of the same samples.

Scaled down to run here in minutes (default 10,000 tiny generated JPEGs, 1% appended; the issue's
figure is for 100k). Each round alternates the order of the two timed commands; the figures are
medians of ``--rounds`` ratios.

    pack bench run append --images 10000 --fraction 0.01 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer.edit.append import append_to
from packer.engine.pack_run import pack_folder
from packer.sources.source import scan_folder
from readers.formats.packed_sample import PreprocessSpec


def make_images(root: Path, count: int, classes: int, seed: int, prefix: str) -> Path:
    """``count`` small JPEGs (smooth random gradients: they compress like photos) in class folders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32) / 31
    for i in range(count):
        folder = root / f"class{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.random(3, dtype=np.float32) * 255
        pixels = np.stack([a * yy, b * xx, c * (1 - yy)], -1)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            folder / f"{prefix}{i:06d}.jpg", quality=90
        )
    return root


def read_rate(dataset: Path, batch_size: int) -> float:
    """Images per second of one decoded, shuffled pass (in this process)."""
    from readers import open_iterable

    it = open_iterable(dataset, shuffle=True, seed=0, batch_size=batch_size, resize=32, crop=32)
    started, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
    return seen / (time.perf_counter() - started)


def run(images: int, fraction: float, rounds: int, fmt: str, workers: int, work: Path) -> dict[str, Any]:
    added = max(1, round(images * fraction))
    old = make_images(work / "old", images, 10, 0, "o")
    new = make_images(work / "new", added, 11, 1, "n")  # one class the dataset does not have
    union = work / "union"
    shutil.copytree(old, union)
    shutil.copytree(new, union, dirs_exist_ok=True)
    spec = PreprocessSpec(encode="original")
    full_s, append_s, cost, reads = [], [], [], []
    for r in range(rounds):
        base, fresh = work / f"base{r}", work / f"fresh{r}"

        started = time.perf_counter()
        pack_folder(old, base, fmt, spec, workers=workers)
        full_time = time.perf_counter() - started  # the append needs the pack: reads alternate
        started = time.perf_counter()
        append_to(base, scan_folder(new), workers=workers)
        append_time = time.perf_counter() - started
        pack_folder(union, fresh, fmt, spec, workers=workers)
        for warm in (base, fresh):  # the first read in a process pays imports and first opens
            read_rate(warm, 256)
        first, second = [(base, fresh), (fresh, base)][r % 2]
        rates = {first: 0.0, second: 0.0}
        for p in (first, second, second, first):  # A B B A: a drift during the round cancels
            rates[p] += read_rate(p, 256) / 2
        full_s.append(full_time)
        append_s.append(append_time)
        cost.append(append_time / full_time)
        reads.append(rates[base] / rates[fresh])
        shutil.rmtree(base)
        shutil.rmtree(fresh)
    return {
        "images": images,
        "appended": added,
        "format": fmt,
        "rounds": rounds,
        "full_pack_s": statistics.median(full_s),
        "append_s": statistics.median(append_s),
        "append_over_full_pack": statistics.median(cost),
        "appended_over_fresh_read_rate": statistics.median(reads),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--images", type=int, default=10_000, help="samples of the dataset appended to")
    parser.add_argument("--fraction", type=float, default=0.01, help="appended share of --images")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed")
    parser.add_argument("--format", default="lmdb", help="dataset format")
    parser.add_argument("--workers", type=int, default=2, help="pack workers")
    parser.add_argument("--workdir", default=None, help="scratch folder [default: a temporary one]")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        result = run(args.images, args.fraction, args.rounds, args.format, args.workers, Path(work))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
