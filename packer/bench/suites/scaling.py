#!/usr/bin/env python3
"""How packing and reading scale with the number of images: time, disk and memory.

For each size N (``--sizes``, default 1000,10000; add 100000 on a machine with the time): make a
deterministic ImageNet-like folder (packer/bench/bench_data.py), pack it, then read it once in a
fresh process (``packer.bench.run.measure_isolated``). Expected: packing time and disk grow linearly
with N; the reader's start-up (open + first batch), its throughput and its memory stay flat.

    pack bench run scaling --sizes 1000,10000 --size 160x120 --resize 128 --crop 112 \\
        --out /tmp/imgpack-bench/scaling --json scaling.json --plot scaling.png

Generated folders and packed datasets stay under ``--out`` (re-runs reuse the folders).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from packer.bench.bench_data import _parse_size, make_bench_folder
from packer.bench.harness import MemorySampler, folder_bytes
from packer.bench.model import Settings, Target
from packer.bench.run import measure_isolated
from packer.engine.pack_run import pack_folder
from readers.formats.packed_sample import PreprocessSpec


@dataclass
class Point:
    n: int
    pack_seconds: float
    pack_images_per_s: float
    pack_peak_rss_bytes: int
    pack_peak_pss_bytes: int | None
    disk_bytes: int
    bytes_per_image: float
    first_batch_s: float  # reader start-up: open the dataset, start workers, first batch
    read_images_per_s: float
    read_peak_rss_bytes: int
    read_peak_pss_bytes: int | None
    read_path: str


def measure_size(n: int, args: argparse.Namespace, spec: PreprocessSpec) -> Point:
    src = make_bench_folder(args.out / f"src-{n}", n=n, classes=args.classes, size=args.size, verbose=True)
    out = args.out / f"{args.format}-{n}"
    with MemorySampler() as sampler:
        report = pack_folder(src, out, args.format, spec, workers=args.workers, force=True, quiet=True)
    disk = folder_bytes(out)
    settings = Settings(workers=(args.read_workers,), batch_size=args.batch_size, epochs=1, random_reads=0)
    run, _ = measure_isolated(Target(f"{args.format}-{n}", "packed", str(out)), args.read_workers, settings)
    point = Point(
        n=n,
        pack_seconds=report.seconds,
        pack_images_per_s=report.images_per_second,
        pack_peak_rss_bytes=sampler.peak_rss,
        pack_peak_pss_bytes=sampler.peak_pss or None,
        disk_bytes=disk,
        bytes_per_image=disk / n,
        first_batch_s=run.first_batch_s,
        read_images_per_s=run.images_per_s,
        read_peak_rss_bytes=run.peak_rss_bytes,
        read_peak_pss_bytes=run.peak_pss_bytes,
        read_path=run.read_path,
    )
    print(
        f"scaling: n={n}: packed in {point.pack_seconds:.1f} s, {disk / 1e6:.1f} MB, "
        f"first batch {point.first_batch_s:.2f} s, read {point.read_images_per_s:,.0f} img/s",
        file=sys.stderr,
    )
    return point


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:,.1f} MB"


def _pss(p: Point, side: str) -> int:
    """Peak PSS where the platform reports it, else peak RSS."""
    return getattr(p, f"{side}_peak_pss_bytes") or getattr(p, f"{side}_peak_rss_bytes")


COLUMNS = [
    ("pack s", lambda p: p.pack_seconds, lambda x: f"{x:.1f}"),
    ("pack img/s", lambda p: p.pack_images_per_s, lambda x: f"{x:,.0f}"),
    ("pack peak PSS", lambda p: _pss(p, "pack"), _mb),
    ("on disk", lambda p: p.disk_bytes, _mb),
    ("bytes/img", lambda p: p.bytes_per_image, lambda x: f"{x:,.0f}"),
    ("first batch", lambda p: p.first_batch_s, lambda x: f"{x:.2f} s"),
    ("read img/s", lambda p: p.read_images_per_s, lambda x: f"{x:,.0f}"),
    ("read peak PSS", lambda p: _pss(p, "read"), _mb),
    ("read peak RSS", lambda p: p.read_peak_rss_bytes, _mb),
]


def table(points: list[Point]) -> str:
    """One row per size, and a last row with the growth from the smallest to the largest size."""
    headers = ["images"] + [name for name, _, _ in COLUMNS]
    rows = [[f"{p.n:,}"] + [fmt(get(p)) for _, get, fmt in COLUMNS] for p in points]
    a, b = points[0], points[-1]
    growth = [f"x{b.n / a.n:g}"] + [f"x{get(b) / get(a):.2f}" if get(a) else "-" for _, get, _ in COLUMNS]
    widths = [max(len(r[i]) for r in [headers, *rows, growth]) for i in range(len(headers))]
    rule = "  ".join("-" * w for w in widths)

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    lines = [line(headers), rule, *map(line, rows)]
    if len(points) > 1:
        lines += [
            rule,
            line(growth),
            f"(last row: largest size over smallest, for {b.n / a.n:g}x the images)",
        ]
    return "\n".join(lines)


def plot(points: list[Point], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ns = [p.n for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    panels = [
        ("time", "seconds", [("pack time", "pack s"), ("reader first batch", "first batch")]),
        ("disk", "MB", [("on disk", "on disk")]),
        (
            "memory (process tree)",
            "MB",
            [("pack peak PSS", "pack peak PSS"), ("read peak PSS", "read peak PSS")],
        ),
    ]
    getters = {name: get for name, get, _ in COLUMNS}
    for ax, (title_, unit, lines) in zip(axes, panels):
        scale = 1e6 if unit == "MB" else 1
        for label, column in lines:
            ax.plot(ns, [getters[column](p) / scale for p in points], marker="o", label=label)
        first = getters[lines[0][1]](points[0]) / scale
        ax.plot(ns, [first * n / ns[0] for n in ns], ls=":", color="0.5", label="linear in N")
        ax.set(xscale="log", yscale="log", xlabel="images", ylabel=unit, title=title_)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="image counts, e.g. 1000,10000,100000")
    parser.add_argument("--size", type=_parse_size, default=(500, 375), help="nominal source WxH (500x375)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--format", default="lmdb", help="packed format (any registered writer)")
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--encode", default="jpeg")
    parser.add_argument("--workers", type=int, default=2, help="packing processes")
    parser.add_argument("--read-workers", type=int, default=2, help="DataLoader workers when reading")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("/tmp/imgpack-scaling"))
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--plot", type=Path, help="write a PNG chart (needs matplotlib)")
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    spec = PreprocessSpec(resize=args.resize, crop=args.crop or None, encode=args.encode)
    started = time.perf_counter()
    points = [measure_size(n, args, spec) for n in sizes]
    title = (
        f"imgpack scaling: {args.format}, sources ~{args.size[0]}x{args.size[1]} JPEG, resize {args.resize} "
        f"crop {args.crop} {args.encode}, {args.workers} pack workers, {args.read_workers} read workers"
    )
    print(title)
    print(table(points))
    if args.json:
        data = {
            "title": title,
            "args": {k: str(v) for k, v in vars(args).items()},
            "points": [asdict(p) for p in points],
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    if args.plot:
        plot(points, args.plot, title)
    print(f"(total {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0 if all(math.isfinite(p.first_batch_s) for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
