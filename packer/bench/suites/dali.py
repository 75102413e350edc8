#!/usr/bin/env python3
"""Images/s of each ``readers.dali`` path on this machine: DALI mixed (GPU), DALI CPU, DataLoader CPU.

Input: 2,000 ImageNet-like JPEGs packed into LMDB with ``--resize 256`` (shorter side 256,
quality 90); output: 224x224 centre crops, uint8 (``--normalize`` for float32 mean/std output).
Paths that cannot run here (no GPU, no DALI) are listed as skipped. Runs unchanged on a GPU
machine. Each path runs one warm-up pass, then whole epochs for at least ``--seconds``.

    pack bench run dali                  # table
    pack bench run dali --json           # machine-readable
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from packer.bench.bench_data import make_bench_folder
from packer.bench.harness import EpochTimes, time_epoch
from packer.bench.prepare import ensure_packed
from readers.dali import DaliUnavailableError, dali_loader, select_path

BENCH = Path("/tmp/imgpack-bench")
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
PATHS = {"dali-gpu": "gpu", "dali-cpu": "cpu", "dataloader": "dataloader"}


def prepare(n: int, quiet: bool) -> Path:
    """The packed LMDB input (made once: a bench_data folder, packed at --resize 256)."""
    from readers.formats.packed_sample import PreprocessSpec

    src = make_bench_folder(BENCH / f"n{n}", n, verbose=not quiet)
    spec = PreprocessSpec(resize=256)
    return ensure_packed(src, BENCH / "dali" / f"n{n}-r256.lmdb", "lmdb", spec, workers=os.cpu_count() or 1)


def measure(path: Path, name: str, args: argparse.Namespace) -> dict:
    import torch

    batch = args.batch_size or (256 if name == "dali-gpu" else 64)
    threads = args.threads or os.cpu_count() or 1
    loader = dali_loader(
        path,
        batch_size=batch,
        device=PATHS[name],
        crop=224,
        num_threads=threads,
        num_workers=threads,
        py_workers=args.py_workers,
        pad_last=False,
        mean=MEAN if args.normalize else None,
        std=STD if args.normalize else None,
    )
    sync = torch.cuda.synchronize if name == "dali-gpu" else (lambda: None)

    def epoch(e: int):
        loader.set_epoch(e)
        yield from loader
        sync()  # the GPU's queued work belongs to the epoch

    times = EpochTimes()
    started = time.perf_counter()
    time_epoch(epoch(0), times, started)  # warm-up: pipeline build, worker start, page cache
    first = time.perf_counter() - started
    while len(times.seconds) == 1 or sum(times.seconds[1:]) < args.seconds:
        time_epoch(epoch(len(times.seconds)), times, started)
    images, epochs, seconds = sum(times.images[1:]), len(times.seconds) - 1, sum(times.seconds[1:])
    return {
        "path": name,
        "images_per_s": round(images / seconds, 1),
        "images": images,
        "epochs": epochs,
        "seconds": round(seconds, 2),
        "batch_size": batch,
        "threads": threads,
        "py_workers": args.py_workers,
        "warmup_s": round(first, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="images in the benchmark set (default 2000)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 256 on the GPU, else 64")
    parser.add_argument("--threads", type=int, default=None, help="DALI threads / DataLoader workers")
    parser.add_argument("--py-workers", type=int, default=0, help="DALI parallel external_source workers")
    parser.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per path")
    parser.add_argument("--normalize", action="store_true", help="float32 mean/std output")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of paths")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    data = prepare(args.n, quiet=args.json)
    rows = []
    for name in args.paths.split(","):
        try:
            select_path(PATHS[name])
        except DaliUnavailableError as exc:
            rows.append({"path": name, "skipped": str(exc)})
            continue
        rows.append(measure(data, name, args))
    base = next((r["images_per_s"] for r in rows if r["path"] == "dataloader" and "images_per_s" in r), None)
    for r in rows:
        if base and "images_per_s" in r:
            r["vs_dataloader"] = round(r["images_per_s"] / base, 2)
    if args.json:
        print(json.dumps({"data": str(data), "cpus": os.cpu_count(), "results": rows}, indent=2))
        return 0
    print(f"{data}: 256 px JPEG in, 224x224 crop out; {os.cpu_count()} CPUs")
    print(f"{'path':<12}{'images/s':>10}{'x dataloader':>14}{'batch':>7}{'threads':>9}{'warm-up s':>11}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['path']:<12}{'skipped: ' + r['skipped'][:70]:>10}")
        else:
            ratio = r.get("vs_dataloader", "")
            print(
                f"{r['path']:<12}{r['images_per_s']:>10.0f}{ratio:>14}{r['batch_size']:>7}"
                f"{r['threads']:>9}{r['warmup_s']:>11}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
