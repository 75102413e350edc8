"""Bucketed reads against the square centre crop: img/s, pixels kept, leftovers per epoch.

    pack bench run buckets --n 600 --side 224 --rounds 3 --workers 2
    pack bench run buckets --n 600 --side 224 --rounds 3 --workers 2 --dali

Packs two sets into a scratch folder (kept between runs): ImageNet-like JPEGs
(``packer/bench/bench_data.py``, shorter side 300-500, one in five portrait) and a set of 16:9 and
9:16 JPEGs. Reads the first with ``buckets=AspectBuckets(area=side**2, multiple=32)`` and with
``resize=side, crop=side`` (same output area, same workers, batch 64), alternating, median of
``--rounds`` epochs each; prints the ratio, the mean fraction of each image kept by each read on
both sets, and the samples padded (the default rule), dropped or carried to the next epoch per
epoch for 1 and 8 ranks. Numbers vary with the machine's load.
``--dali`` reads both through ``dali_loader(device="cpu")``'s DALI pipeline instead (``--workers``
DALI threads): the bucketed read resizes each sample's window to its bucket in DALI.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer.engine.pack_run import pack_folder
from readers import AspectBuckets, make_loader, open_iterable
from readers.bucketing.bucket_plan import sample_sizes, summary
from readers.dali import dali_loader
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec

BATCH = 64


def widescreen_folder(out: Path, n: int) -> Path:
    """``n`` JPEGs, half 16:9 (640x360) and half 9:16, noise over gradients."""
    if (out / "done").exists():
        return out
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = (360, 640) if i % 2 else (640, 360)
        folder = out / f"class_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (np.linspace(0, 255, w)[None, :, None] + rng.integers(0, 60, (h, w, 3))).clip(0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"img_{i:05d}.jpg", quality=90)
    (out / "done").write_text("")
    return out


def packed(src: Path, out: Path) -> Path:
    if not (out / "manifest.json").exists():
        pack_folder(src, out, "lmdb", PreprocessSpec(), workers=2, options={})
    return out


def epoch_rate(path: Path, workers: int, **options: Any) -> float:
    loader = make_loader(open_iterable(path, batch_size=BATCH, seed=0, **options), num_workers=workers)
    next(iter(loader))  # workers started, first batch out of the timing
    start = time.perf_counter()
    count = sum(len(images) for images, _ in loader)
    return count / (time.perf_counter() - start)


def dali_epoch_rate(path: Path, threads: int, **options: Any) -> float:
    loader = dali_loader(path, batch_size=BATCH, seed=0, device="cpu", num_threads=threads, **options)
    batches = iter(loader)
    next(batches)  # the pipeline built, first batch out of the timing
    start = time.perf_counter()
    count = sum(len(images) for images, _ in batches)
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    from packer.bench.bench_data import make_bench_folder

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dali", action="store_true", help="read through DALI's CPU pipeline")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/imgpack-bench-buckets"))
    args = parser.parse_args(argv)
    folder = make_bench_folder(args.dir / "photos", n=args.n, classes=10, seed=0)
    photos = packed(folder, args.dir / "photos.lmdb")
    wide = packed(widescreen_folder(args.dir / "wide", args.n // 4), args.dir / "wide.lmdb")
    buckets = AspectBuckets(area=args.side**2, multiple=32)
    rates: dict[str, list[float]] = {"buckets": [], "square": []}
    rate = dali_epoch_rate if args.dali else epoch_rate
    for r in range(args.rounds):
        order = ("buckets", "square") if r % 2 == 0 else ("square", "buckets")
        for name in order:
            options = {"buckets": buckets} if name == "buckets" else {"resize": args.side, "crop": args.side}
            rates[name].append(rate(photos, args.workers, **options))
    ratios = [b / s for b, s in zip(rates["buckets"], rates["square"])]
    setup = f"batch {BATCH}, {args.workers} workers, ~{args.side}^2 px out"
    if args.dali:
        setup = f"DALI CPU pipeline, batch {BATCH}, {args.workers} threads, ~{args.side}^2 px out"
    print(f"read, {args.n} ImageNet-like JPEGs, {setup}:")
    for name, values in rates.items():
        rounds = [round(v) for v in values]
        print(f"  {name:8} median {statistics.median(values):8.0f} img/s  rounds {rounds}")
    rounded = [round(x, 2) for x in ratios]
    print(f"  bucketed / square: median {statistics.median(ratios):.2f}x  rounds {rounded}")
    for label, path in (("ImageNet-like", photos), ("16:9 + 9:16", wide)):
        reader = open_reader(path)
        sizes = sample_sizes(reader)
        reader.close()
        plan = summary(buckets, sizes, BATCH)
        kept, square = 100 * plan["kept"], 100 * plan["kept_square"]
        print(f"pixels kept, {label}: bucketed {kept:.1f}%, square centre crop {square:.1f}%", end="")
        print(f"; {len(plan['buckets'])} buckets")
        for world in (1, 8):
            rules = leftovers(buckets, sizes, world)
            print(f"  leftovers per epoch, {world} rank(s), of {len(sizes)}: {rules}")


def leftovers(buckets: AspectBuckets, sizes: np.ndarray, world: int) -> str:
    """Samples each leftover rule pads, drops or carries per epoch (the default, ``pad``, first)."""
    words = []
    for rule, verb in (("pad", "padded"), ("drop", "dropped"), ("carry", "carried")):
        plan = summary(dataclasses.replace(buckets, leftover=rule), sizes, BATCH, world)
        words.append(f"{plan['carried'] if rule == 'carry' else plan['leftovers']} {verb} ({rule})")
    return ", ".join(words)


if __name__ == "__main__":
    main()
