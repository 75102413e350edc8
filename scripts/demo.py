"""`make demo`: pack sample_data/ into every format, read each back, and benchmark them.

python scripts/demo.py [--out demo_out]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

from readers import open_dataset, open_iterable, read_manifest
from readers.formats import format_named, format_names

REPO = Path(__file__).resolve().parent.parent


def format_args(fmt: str) -> list[str]:
    """``--encode`` for a format that stores one encoding only (the default, jpeg, does not apply)."""
    encodings = format_named(fmt).encodings
    return ["--encode", encodings[0]] if len(encodings) == 1 else []


def pack(fmt: str, out: Path) -> list[str]:
    cmd = [
        "pack",
        "imagefolder",
        "sample_data",
        "--to",
        fmt,
        "-o",
        str(out),
        "--resize",
        "160",
        "--crop",
        "128",
        "--force",
        "-q",
        *format_args(fmt),
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run([sys.executable, "-m", "packer.cli", *cmd[1:]], cwd=REPO, check=True)
    return cmd


def read_back(path: Path) -> dict[str, float]:
    ds = open_dataset(path, decode="tensor")
    image, label = ds[0]
    it = open_iterable(path, shuffle=True, seed=0, batch_size=16)
    loader = DataLoader(it, batch_size=None, num_workers=2)
    start = time.perf_counter()
    seen = sum(len(images) for images, _ in loader)
    seconds = time.perf_counter() - start
    assert seen == len(ds), (seen, len(ds))
    return {
        "samples": len(ds),
        "shape": tuple(image.shape),
        "label": ds.classes[label],
        "bytes": sum(s.bytes for s in read_manifest(path).shards),
        "epoch_s": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "demo_out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for fmt in format_names():
        path = args.out / f"sample.{fmt}"
        pack(fmt, path)
        results[fmt] = read_back(path)
    print(f"\n{'format':8s} {'samples':>7s} {'size':>9s} {'first image':>16s}  epoch (2 workers)")
    for fmt, r in results.items():
        print(
            f"{fmt:8s} {r['samples']:7d} {r['bytes'] / 1e6:7.2f}MB {str(r['shape']):>16s}"
            f"  {r['epoch_s']:.2f} s"
        )
    datasets = [str(args.out / f"sample.{fmt}") for fmt in results]
    bench = [
        sys.executable,
        "-m",
        "packer.cli",
        "bench",
        *datasets,
        "--baseline",
        "sample_data",
        "--workers",
        "0,2",
        "--epochs",
        "1",
        "--plot",
        str(args.out / "bench.png"),
    ]
    print("\n$ pack bench", " ".join(datasets), "--baseline sample_data --workers 0,2 --epochs 1", flush=True)
    subprocess.run(bench, cwd=REPO, check=True)
    print(f"\nbenchmark chart: {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
