#!/usr/bin/env python3
"""block_size / buffer_size vs reading throughput vs class mix, for local LMDB, local tar and a
remote tar (ranged reads from a moto S3 server on 127.0.0.1).

Packs the benchmark folder (``packer/bench/bench_data.py``, class-sorted) twice per format: in
source order (``--order source``, what packs were before shuffling at pack time) and shuffled (the
default). For every (block_size, buffer_size) it times the batch path (``open_iterable(batch_size=B,
crop=C)`` through ``make_loader``, persistent workers; packer.bench's epoch timer: median of the
timed epochs after a warm-up) and computes ``readers.shuffle_quality`` for both packs. Prints a
markdown table.

    pack bench run order --n 2000 --classes 100 --workers 2
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from packer.bench.bench_data import make_bench_folder
from packer.bench.harness import time_epochs
from packer.engine.pack_run import pack_folder
from readers import make_loader, open_iterable, shuffle_quality
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec

GRID = [(16, 1024), (64, 1024), (64, 4096), (256, 4096), (16, 4096)]


def throughput(path: str, block: int, buffer: int, args, **options) -> float:
    it = open_iterable(
        path, batch_size=args.batch_size, crop=args.crop, block_size=block, buffer_size=buffer, **options
    )
    loader = make_loader(it, num_workers=args.workers, persistent_workers=args.workers > 0)
    return time_epochs(loader, args.epochs).median


def mix_cell(labels, block: int, buffer: int, batch: int) -> str:
    q = shuffle_quality(labels, batch_size=batch, block_size=block, buffer_size=buffer)
    return f"{q.mean_distinct:.1f} / {q.mean_largest_class:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crop", type=int, default=112)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs after a warm-up (median)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/imgpack-bench/order"))
    args = parser.parse_args()
    src = make_bench_folder(Path(f"/tmp/imgpack-bench/n{args.n}-c{args.classes}"), args.n, args.classes)
    spec = PreprocessSpec(resize=128)
    packs = {}
    for fmt in ("lmdb", "tar"):
        for order in ("source", "shuffled"):
            out = args.out / f"{fmt}-{order}-n{args.n}-c{args.classes}"
            if not (out / "manifest.json").exists():
                pack_folder(src, out, fmt, spec, workers=2, order=order, force=True)
            packs[fmt, order] = out
    labels = {order: open_reader(packs["lmdb", order]).labels() for order in ("source", "shuffled")}
    from packer.bench.s3server import moto_s3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with moto_s3("bench") as (fs, storage):
        fs.put(str(packs["tar", "shuffled"]) + "/", "bench/tar", recursive=True)
        targets = {
            "lmdb": (str(packs["lmdb", "shuffled"]), {}),
            "tar": (str(packs["tar", "shuffled"]), {}),
            "remote tar": ("s3://bench/tar", {"reader_options": {"storage_options": storage}}),
        }
        rows = []
        for block, buffer in GRID:
            rates = [throughput(path, block, buffer, args, **opts) for path, opts in targets.values()]
            rows.append(
                [str(block), str(buffer), *(f"{r:,.0f}" for r in rates)]
                + [mix_cell(labels[o], block, buffer, args.batch_size) for o in ("source", "shuffled")]
            )
    iid = shuffle_quality(labels["shuffled"], batch_size=args.batch_size)
    headers = ["block_size", "buffer_size", *(f"{t} img/s" for t in targets)]
    headers += ["class-sorted pack: classes / top", "shuffled pack: classes / top"]
    print(f"{args.n} images, {len(set(labels['source'].tolist()))} classes, batch {args.batch_size}, "
          f"crop {args.crop}, {args.workers} workers, {os.cpu_count()} CPUs; i.i.d.: "
          f"{iid.iid_mean_distinct:.1f} classes / top {iid.iid_mean_largest_class:.1f}")  # fmt: skip
    print("| " + " | ".join(headers) + " |")
    print("|" + "---:|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
