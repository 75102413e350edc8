"""Views against their parent: read rate, parent reads per batch, and what a view costs to make.

A synthetic dataset (``--samples`` JPEGs of ``--size`` px in 10 classes) is packed per format;
then views of it: ``all`` (every index: the pure cost of the indirection), ``train`` (the 95%
side of ``pack split --val 0.05``) and ``half`` (a random half). Each round reads one epoch of
the parent and of every view with ``open_iterable(batch_size=, crop=, shuffle=True)`` in the
calling process, then the records of the same shuffled order without decoding (``read_many``
batch by batch: where a view's indirection costs the most, relatively), in an order of paths that
alternates from round to round; each figure is the median over rounds of the round's ratio
view/parent of samples per CPU second of the process (see MIN_CPU_S). Also counted: the parent's
reads per batch (``counting``: one per run of near indices; a view read position by position
would make one per sample), the seconds ``split_views`` takes and the bytes of a view.

    pack bench run views --samples 4000 --rounds 7 --formats lmdb,tar,hdf5,tfrecord,bmp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from packer.bench.harness import folder_bytes, machine_info
from readers.formats import format_names

VIEWS = ("all", "train", "half")
# Rates are samples per CPU second of this process (everything runs in it, no workers): on a
# shared machine the CPU time of a pass varies far less than its wall time.
MIN_CPU_S = 0.25


def make_images(root: Path, samples: int, size: int, seed: int = 0) -> Path:
    """``samples`` small JPEGs in 10 class folders: smooth colour fields (JPEG-friendly)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    for i in range(samples):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 256, (2, 3)).astype(np.float32)
        pixels = colour[0] + (colour[1] - colour[0]) * ramp[:, None, None] * ramp[None, :, None]
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i:06d}.jpg", quality=90)
    return root


def counting(reader: Any) -> list[int]:
    """Count the reads ``reader`` (a view's parent, or a dataset) makes from now on: its
    ``read_local`` calls (one sequential read each), or for a format with its own ``read_many``
    (LMDB: one ``getmulti`` per environment) or ``read_block`` (BMP: a file per sample) those."""
    from readers.formats import FormatReader

    calls = [0]
    for name in ("read_many", "read_block", "read_local"):
        if getattr(type(reader), name) is not getattr(FormatReader, name):
            break
    original = getattr(reader, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    setattr(reader, name, counted)
    return calls


def epoch_rate(path: str, epoch: int, batch_size: int, crop: int) -> tuple[float, float]:
    """(samples/s, parent read_block calls per batch) of one epoch of ``path``."""
    from readers import open_iterable

    it = open_iterable(path, batch_size=batch_size, crop=crop, shuffle=True, seed=0)
    it.set_epoch(epoch)
    reader = it.reader
    calls = counting(getattr(reader, "parent", reader))
    started, samples, batches = time.process_time(), 0, 0
    for _, labels in it:
        samples += len(labels)
        batches += 1
    return samples / (time.process_time() - started), calls[0] / max(1, batches)


def records_rate(path: str, epoch: int, batch_size: int) -> float:
    """Samples/s of reading the records (no decode) of one shuffled epoch of ``path``, batch by
    batch: where the indirection of a view costs the most, relatively."""
    from readers.formats import open_reader
    from readers.order.epoch_order import OrderSpec

    reader = open_reader(path)
    order = OrderSpec(len(reader), True, 0, 64, 4096).epoch_order(epoch)
    started, passes = time.process_time(), 0
    while passes == 0 or time.process_time() - started < MIN_CPU_S:  # an epoch takes milliseconds
        for start in range(0, len(order), batch_size):
            reader.read_many(order[start : start + batch_size])
        passes += 1
    seconds = time.process_time() - started
    reader.close()
    return passes * len(order) / seconds


def bench_format(fmt: str, images: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from packer.edit.views import split_views, write_view
    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    parent = work / f"{fmt}-parent"
    encode = "bmp" if fmt == "bmp" else "jpeg"
    pack_folder(images, parent, fmt, PreprocessSpec(encode=encode), workers=args.workers)
    started = time.perf_counter()
    split_views(parent, work / f"{fmt}-split", val=0.05, seed=0)
    split_s = time.perf_counter() - started
    paths = {"parent": str(parent), "train": str(work / f"{fmt}-split" / "train")}
    write_view(parent, work / f"{fmt}-all", np.arange(args.samples))
    paths["all"] = str(work / f"{fmt}-all")
    half = np.random.default_rng(1).permutation(args.samples)[: args.samples // 2]
    write_view(parent, work / f"{fmt}-half", half)
    paths["half"] = str(work / f"{fmt}-half")
    rates: dict[str, list[float]] = {name: [] for name in paths}
    records: dict[str, list[float]] = {name: [] for name in paths}
    reads: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.rounds + 1):  # round 0 warms the page cache, not counted
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            rate, per_batch = epoch_rate(paths[name], round_, args.batch_size, args.crop)
            only = records_rate(paths[name], round_, args.batch_size)
            if round_:
                rates[name].append(rate)
                records[name].append(only)
                reads[name].append(per_batch)
    out: dict[str, Any] = {
        "format": fmt,
        "parent_samples_per_s": round(statistics.median(rates["parent"]), 1),
        "parent_records_per_s": round(statistics.median(records["parent"]), 1),
        "parent_reads_per_batch": round(statistics.median(reads["parent"]), 2),
        "split_s": round(split_s, 3),
        "parent_bytes": folder_bytes(parent),
    }
    for name in VIEWS:
        ratios = [v / p for v, p in zip(rates[name], rates["parent"])]
        record_ratios = [v / p for v, p in zip(records[name], records["parent"])]
        out[name] = {
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "records_ratio": round(statistics.median(record_ratios), 3),
            "records_ratios": [round(r, 3) for r in record_ratios],
            "reads_per_batch": round(statistics.median(reads[name]), 2),
            "view_bytes": folder_bytes(paths[name]),
        }
    return out


def table(results: list[dict[str, Any]]) -> str:
    """Per format: the parent's rates, then per view the decoded and records-only ratios."""
    head = " | ".join(f"{v}: ratio, records ratio, reads/batch" for v in VIEWS)
    lines = [
        f"| format | parent: samples/s, records/s, reads/batch | {head} | split s |",
        "|---|---|" + "---|" * len(VIEWS) + "---|",
    ]
    for r in results:
        cells = [
            f"{r[v]['ratio']:.2f}, {r[v]['records_ratio']:.2f}, {r[v]['reads_per_batch']:.1f}" for v in VIEWS
        ]
        rates = (r["parent_samples_per_s"], r["parent_records_per_s"], r["parent_reads_per_batch"])
        parent = "{:.0f}, {:.0f}, {:.1f}".format(*rates)
        lines.append(f"| {r['format']} | {parent} | " + " | ".join(cells) + f" | {r['split_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--samples", type=int, default=4000, help="Images in the synthetic dataset.")
    parser.add_argument("--size", type=int, default=64, help="Their side in pixels.")
    parser.add_argument(
        "--formats", default="lmdb,tar", help=f"Comma-separated, of: {', '.join(format_names())}."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds (after one warm-up round).")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crop", type=int, default=48, help="Centre crop of the read.")
    parser.add_argument("--workers", type=int, default=2, help="Packing processes.")
    parser.add_argument("--workdir", default=None, help="Where to pack (default: a temporary folder).")
    parser.add_argument("--json", dest="json_out", default=None, help="Also write the results here.")
    args = parser.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(format_names()))
    if unknown:
        parser.error(f"--formats: unknown {', '.join(unknown)}; choose from {', '.join(format_names())}")
    with tempfile.TemporaryDirectory(prefix="imgpack-views-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        images = make_images(work / "images", args.samples, args.size)
        info = machine_info()
        results = [bench_format(fmt, images, work, args) for fmt in formats]
    info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(table(results))
    print(f"load average at start {info['load_average_at_start']}, at end {info['load_average_at_end']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
