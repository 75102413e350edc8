#!/usr/bin/env python3
"""Benchmark the BMP cache and raw HDF5 against an ImageFolder decoded by Pillow every epoch.

All three feed a DataLoader with the same number of workers and batch size and produce the same
thing: uint8 (B, 3, 224, 224) batches plus labels. The packed datasets are made once (resize
shorter side to 256, centre crop 224: the same transform the baseline applies every epoch) and
read with ``open_iterable(batch_size=B)``, whose workers assemble whole batches. The baseline is
a plain map-style Dataset: PIL open -> resize shorter side 256 -> centre crop 224 -> tensor.

Each loader runs one warm-up epoch (worker start, page cache), then ``--epochs`` timed epochs
with persistent workers, the loaders taking turns epoch by epoch so that they see the same
background load; the median epoch is reported. Ratios are more stable than absolute figures
on a shared machine.

    python scripts/make_bench_data.py --n 2000 --out /tmp/imgpack-bench/n2000
    python scripts/bench_formats.py --data /tmp/imgpack-bench/n2000 --out /tmp/imgpack-bench/hdf5bmp
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packer.engine import pack_folder  # noqa: E402
from packer.preprocess import PreprocessSpec  # noqa: E402
from packer.source import scan_folder  # noqa: E402
from readers import open_iterable  # noqa: E402
from readers.manifest import MANIFEST_NAME  # noqa: E402

RESIZE, CROP = 256, 224


class PillowFolder(Dataset):
    """The no-packing baseline: decode and resize every image with Pillow, every epoch."""

    def __init__(self, root: Path):
        self.items = [(item.path, item.label) for item in scan_folder(root).items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with Image.open(path) as img:
            img = img.convert("RGB")
            scale = RESIZE / min(img.size)
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BILINEAR)
            left, top = (img.width - CROP) // 2, (img.height - CROP) // 2
            img = img.crop((left, top, left + CROP, top + CROP))
            array = np.asarray(img)
        return torch.from_numpy(array).permute(2, 0, 1).contiguous(), label


def ensure_packed(src: Path, out: Path, fmt: str, workers: int) -> Path:
    if not (out / MANIFEST_NAME).exists():
        spec = PreprocessSpec(resize=RESIZE, crop=CROP, encode="raw" if fmt == "hdf5" else "bmp")
        started = time.perf_counter()
        report = pack_folder(src, out, fmt, spec, workers=workers, force=True)
        print(f"packed {fmt}: {report.packed} images in {time.perf_counter() - started:.1f} s", flush=True)
    return out


def epoch_rate(loader: DataLoader) -> float:
    """Images per second over one epoch of ``loader``."""
    started = time.perf_counter()
    images = 0
    for batch, labels in loader:
        assert batch.dtype == torch.uint8 and batch.shape[1:] == (3, CROP, CROP), batch.shape
        images += len(labels)
    return images / (time.perf_counter() - started)


def measure(loaders: dict[str, tuple[DataLoader, Any]], rounds: int) -> dict[str, float]:
    """Median images/s per loader: one warm-up epoch each, then ``rounds`` epochs taken in turn.

    Taking the loaders in turn, epoch by epoch, exposes them to the same background load.
    """
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for epoch in range(rounds + 1):
        for name, (loader, set_epoch) in loaders.items():
            if set_epoch is not None:
                set_epoch(epoch)
            rate = epoch_rate(loader)
            if epoch > 0:
                rates[name].append(rate)
    return {name: statistics.median(values) for name, values in rates.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("/tmp/imgpack-bench/n2000"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/imgpack-bench/hdf5bmp"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per reader (median reported)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    paths = {
        fmt: ensure_packed(args.data, args.out / f"{fmt}-224", fmt, args.workers) for fmt in ("bmp", "hdf5")
    }
    common = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    loaders: dict[str, tuple[DataLoader, Any]] = {
        "imagefolder_pillow": (
            DataLoader(PillowFolder(args.data), batch_size=args.batch, shuffle=True, **common),
            None,
        )
    }
    for fmt, path in paths.items():
        it = open_iterable(path, shuffle=True, seed=0, batch_size=args.batch)
        loaders[f"{fmt}_iterable"] = (DataLoader(it, batch_size=None, **common), it.set_epoch)
    results = measure(loaders, args.epochs)

    base = results["imagefolder_pillow"]
    print(
        f"{'reader':<22}{'images/s':>10}{'ratio':>8}   ({args.workers} workers, batch {args.batch}, {CROP}px)"
    )
    for name, rate in results.items():
        print(f"{name:<22}{rate:>10.0f}{rate / base:>7.1f}x")
    summary = {
        "images_per_second": results,
        "ratio_vs_imagefolder": {k: v / base for k, v in results.items()},
        "workers": args.workers,
        "batch": args.batch,
        "epochs": args.epochs,
        "data": str(args.data),
        "samples": len(PillowFolder(args.data)),
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
