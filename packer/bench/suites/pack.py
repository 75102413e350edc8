"""Packing speed and memory: `pack imagefolder --to lmdb --resize 256` against a naive script.

The naive baseline is what people write first: one process, Pillow decode + resize + JPEG
encode, the label's 8 bytes and the JPEG bytes as one LMDB value, a commit every 1,000 images.

    pack bench run pack --n 2000            # speed: naive vs imgpack 1 and 2 workers
    pack bench run pack --n 10000 --only imgpack2   # peak memory at 10k images
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from packer.bench.bench_data import make_bench_folder
from packer.bench.harness import code_env, run_measured


def naive_pack(src: Path, out: Path, size: int = 256) -> int:
    import lmdb

    from packer.bench.prepare import naive_jpeg

    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    env = lmdb.open(str(out), map_size=1 << 40)
    txn = env.begin(write=True)
    n = 0
    for label, name in enumerate(classes):
        for path in sorted((src / name).iterdir()):
            jpeg = naive_jpeg(path, size)
            txn.put(f"{n:08d}".encode(), label.to_bytes(8, "little", signed=True) + jpeg)
            n += 1
            if n % 1000 == 0:
                txn.commit()
                txn = env.begin(write=True)
    txn.commit()
    env.close()
    return n


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="images in the generated folder")
    parser.add_argument("--data", type=Path, default=None, help="folder to pack (default: generated)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/imgpack-bench/pack"))
    parser.add_argument("--only", default="naive,imgpack1,imgpack2", help="comma list of runs")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--naive-run", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_run:
        print(naive_pack(Path(args.naive_run[0]), Path(args.naive_run[1])))
        return 0
    src = args.data or make_bench_folder(Path(f"/tmp/imgpack-bench/n{args.n}"), args.n)
    args.work.mkdir(parents=True, exist_ok=True)
    env = code_env()

    def imgpack(workers: int):
        return lambda out: [sys.executable, "-m", "packer.cli", "imagefolder", str(src), "--to", "lmdb",
                            "-o", str(out), "--resize", "256", "--workers", str(workers), "-q"]  # fmt: skip

    def naive(out: Path) -> list[str]:
        return [sys.executable, "-m", "packer.bench.suites.pack", "--naive-run", str(src), str(out)]

    runs = {
        "naive": naive,
        "imgpack1": imgpack(1),
        "imgpack2": imgpack(2),
    }
    results: dict[str, dict[str, float | None]] = {}
    seconds_of: dict[str, float] = {}
    for name in args.only.split(","):
        out = args.work / name
        shutil.rmtree(out, ignore_errors=True)
        run = run_measured(runs[name](out), env=env)
        seconds, peak = run.seconds, run.peak_rss_bytes
        images = sum(1 for _ in Path(src).rglob("*.jpg"))
        pss = None if run.peak_pss_bytes is None else run.peak_pss_bytes / 1e6
        seconds_of[name] = seconds
        results[name] = {"seconds": seconds, "images_per_s": images / seconds, "peak_rss_mb": peak / 1e6}
        results[name]["peak_pss_mb"] = pss
        print(
            f"{name:9s} {seconds:7.1f} s {images / seconds:8.0f} img/s  peak tree RSS {peak / 1e6:6.0f} MB"
            f"  PSS {pss or float('nan'):6.0f} MB",
            flush=True,
        )
    if "naive" in results:
        for name in results:
            print(f"{name:9s} speed-up vs naive: {seconds_of['naive'] / seconds_of[name]:.2f}x")
    if "imgpack1" in results and "imgpack2" in results:
        print(f"imgpack 2 workers vs 1: {seconds_of['imgpack1'] / seconds_of['imgpack2']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
