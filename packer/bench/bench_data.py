#!/usr/bin/env python3
"""Generate a deterministic ImageNet-like image folder from the photos in ``sample_data/``.

Every output image is a seeded random crop of one of the real sample photographs,
rescaled so that its size varies around ImageNet's typical 500x375 (shorter side
about 300-500 px, roughly one in five portrait), randomly mirrored, and saved as an
RGB JPEG at quality 90; about 10% are saved as progressive JPEGs.

Layout: ``<out>/class_000/img_0000000.jpg`` ... Image ``i`` goes to class
``i % classes``, so classes are balanced. The bytes written depend only on the
parameters, the seed, the source photos and the Pillow/libjpeg version: not on the
number of worker processes.

A ``.params.json`` file records the parameters; when ``out`` already holds a folder
made with the same parameters, nothing is regenerated.

Usage::

    pack bench run bench_data --n 2000 --classes 10 --out /tmp/bench_folder

From Python::

    from packer.bench.bench_data import make_bench_folder
    make_bench_folder(Path("/tmp/bench"), n=200, classes=4, seed=0)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageOps

__all__ = ["DEFAULT_SOURCE", "list_source_photos", "main", "make_bench_folder"]

#: Bump when the generation recipe changes, so that old folders are regenerated.
GENERATOR_VERSION = 1
DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "sample_data"
PARAMS_FILE = ".params.json"
IMAGE_EXTS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
QUALITY = 90
PROGRESSIVE_FRACTION = 0.10
PORTRAIT_FRACTION = 0.20
# Below this many images a pool costs more than it saves.
_MIN_IMAGES_FOR_POOL = 64

# Per-process cache of decoded source photos (filled by _init_worker).
_SOURCES: list[Image.Image] = []


def list_source_photos(source: Path = DEFAULT_SOURCE) -> list[Path]:
    """Return the image files under ``source`` (recursively), sorted, hidden files skipped."""
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"source folder not found: {source}")
    files = [
        p
        for p in source.rglob("*")
        if p.is_file()
        and p.suffix.lower() in IMAGE_EXTS
        and not any(part.startswith(".") for part in p.relative_to(source).parts)
    ]
    if not files:
        raise FileNotFoundError(f"no images under {source}")
    return sorted(files, key=lambda p: p.relative_to(source).as_posix())


def _source_digest(files: Sequence[Path], source: Path) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(source).as_posix().encode())
        h.update(b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _load_rgb(path: Path) -> Image.Image:
    with Image.open(path) as opened:
        opened.load()
        im: Image.Image = ImageOps.exif_transpose(opened)
        if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
            rgba = im.convert("RGBA")
            bg = Image.new("RGB", rgba.size, (255, 255, 255))
            bg.paste(rgba, mask=rgba.getchannel("A"))
            return bg
        return im.convert("RGB")


def _init_worker(files: Sequence[str]) -> None:
    global _SOURCES
    _SOURCES = [_load_rgb(Path(f)) for f in files]


class _Plan(NamedTuple):
    """Every random choice made for one output image."""

    src: int  # index into the sorted source photos
    tw: int  # output width
    th: int  # output height
    scale: float  # 0..1: crop size between its smallest allowed and the largest crop
    fx: float  # horizontal crop position, 0..1
    fy: float  # vertical crop position, 0..1
    flip: bool  # mirror left-right
    progressive: bool  # save as progressive JPEG


def _plan(seed: int, index: int, n_sources: int, size: tuple[int, int]) -> _Plan:
    """Draw every random choice for image ``index`` from an RNG seeded by (seed, index)."""
    rng = random.Random(f"imgpack-bench:{seed}:{index}")
    base_w, base_h = size
    short = max(16, round(min(base_w, base_h) * rng.uniform(0.8, 1.34)))
    aspect = (max(base_w, base_h) / min(base_w, base_h)) * rng.uniform(0.8, 1.2)
    long = max(short, round(short * aspect))
    portrait = rng.random() < PORTRAIT_FRACTION
    if base_w < base_h:  # a portrait base size flips the default orientation
        portrait = not portrait
    tw, th = (short, long) if portrait else (long, short)
    return _Plan(
        src=rng.randrange(n_sources),
        tw=tw,
        th=th,
        scale=rng.random(),
        fx=rng.random(),
        fy=rng.random(),
        flip=rng.random() < 0.5,
        progressive=rng.random() < PROGRESSIVE_FRACTION,
    )


def _render(plan: _Plan) -> Image.Image:
    src = _SOURCES[plan.src]
    tw, th = plan.tw, plan.th
    sw, sh = src.size
    target_aspect = tw / th
    # Largest crop of the target aspect that fits in the source, then shrink it.
    if sw / sh > target_aspect:
        cw_max, ch_max = sh * target_aspect, float(sh)
    else:
        cw_max, ch_max = float(sw), sw / target_aspect
    # Crops span 35-100% of the largest crop, but are never upscaled by more than
    # 1.25x unless the source itself is too small.
    lo = min(1.0, max(0.35, 0.8 * tw / cw_max))
    frac = lo + (1.0 - lo) * plan.scale
    cw, ch = cw_max * frac, ch_max * frac
    x0 = (sw - cw) * plan.fx
    y0 = (sh - ch) * plan.fy
    im = src.resize((tw, th), Image.Resampling.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch), reducing_gap=3.0)
    if plan.flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return im


def _make_one(job: tuple[str, _Plan]) -> int:
    dest, plan = job
    im = _render(plan)
    tmp = dest + ".tmp"
    im.save(tmp, "JPEG", quality=QUALITY, progressive=plan.progressive, optimize=False)
    os.replace(tmp, dest)
    return os.path.getsize(dest)


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 500x375, got {text!r}") from None
    if w < 16 or h < 16:
        raise argparse.ArgumentTypeError(f"size too small: {text!r}")
    return w, h


def _read_params(out: Path) -> dict[str, object] | None:
    try:
        data = json.loads((out / PARAMS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_complete(out: Path, n: int, classes: int) -> bool:
    return all((out / f"class_{i % classes:03d}" / f"img_{i:07d}.jpg").is_file() for i in range(n))


def make_bench_folder(
    out: Path,
    n: int,
    classes: int = 10,
    seed: int = 0,
    size: tuple[int, int] = (500, 375),
    *,
    source: Path = DEFAULT_SOURCE,
    workers: int | None = None,
    force: bool = False,
    verbose: bool = False,
) -> Path:
    """Create (or reuse) an ImageNet-style folder of ``n`` JPEGs in ``classes`` classes.

    Args:
        out: destination folder; created if missing.
        n: number of images (>= 1).
        classes: number of classes ``class_000 ..`` (1 <= classes <= 1000).
        seed: RNG seed; the same seed gives byte-identical files.
        size: nominal (width, height); each image's size is drawn around it.
        source: folder of real photos to crop from (default: the repo's ``sample_data``).
        workers: worker processes (default: ``min(2, cpu_count)``); 1 runs in-process.
        force: regenerate even if ``out`` already matches these parameters, and allow
            writing into a non-empty folder that has no ``.params.json``.
        verbose: print a one-line summary to stdout.

    Returns:
        ``out`` as a Path.

    Raises:
        ValueError: on bad arguments.
        FileExistsError: if ``out`` is a non-empty folder not made by this script
            (no ``.params.json``) and ``force`` is false.
        FileNotFoundError: if ``source`` holds no images.
    """
    out = Path(out)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= classes <= 1000:
        raise ValueError(f"classes must be in 1..1000, got {classes}")
    if min(size) < 16:
        raise ValueError(f"size too small: {size}")
    source = Path(source)
    files = list_source_photos(source)
    params: dict[str, object] = {
        "generator_version": GENERATOR_VERSION,
        "n": n,
        "classes": classes,
        "seed": seed,
        "size": [int(size[0]), int(size[1])],
        "quality": QUALITY,
        "progressive_fraction": PROGRESSIVE_FRACTION,
        "source_sha256": _source_digest(files, source),
        "pillow": Image.__version__,
    }
    start = time.perf_counter()

    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a folder")
        old = _read_params(out)
        if not force and old == params and _is_complete(out, n, classes):
            if verbose:
                print(
                    f"bench_data: {out} already holds {n} images in {classes} classes "
                    f"(seed {seed}); skipped"
                )
            return out
        if old is None and any(out.iterdir()) and not force:
            raise FileExistsError(
                f"{out} is not empty and was not made by bench_data (no {PARAMS_FILE}); "
                "use force=True / --force to write into it anyway"
            )
        # Remove what an earlier run of this script wrote, and nothing else.
        (out / PARAMS_FILE).unlink(missing_ok=True)
        for d in out.glob("class_[0-9][0-9][0-9]"):
            if d.is_dir():
                shutil.rmtree(d)
    out.mkdir(parents=True, exist_ok=True)
    for c in range(classes):
        (out / f"class_{c:03d}").mkdir(exist_ok=True)

    jobs = [
        (
            str(out / f"class_{i % classes:03d}" / f"img_{i:07d}.jpg"),
            _plan(seed, i, len(files), size),
        )
        for i in range(n)
    ]
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    workers = max(1, min(workers, n))
    file_args = [str(p) for p in files]
    if workers == 1 or n < _MIN_IMAGES_FOR_POOL:
        _init_worker(file_args)
        try:
            total = sum(_make_one(job) for job in jobs)
        finally:
            _SOURCES.clear()
    else:
        # fork keeps this usable from a module loaded by path (tests, benchmarks);
        # other start methods would re-import this file by name in each worker.
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else None)
        with ctx.Pool(workers, initializer=_init_worker, initargs=(file_args,)) as pool:
            total = sum(pool.imap_unordered(_make_one, jobs, chunksize=16))

    tmp = out / (PARAMS_FILE + ".tmp")
    tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / PARAMS_FILE)
    if verbose:
        elapsed = time.perf_counter() - start
        print(
            f"bench_data: wrote {n} images in {classes} classes to {out} "
            f"({total / 1e6:.1f} MB, {elapsed:.1f} s, {workers} worker(s), seed {seed}, "
            f"{len(files)} source photos)"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Generate a deterministic ImageNet-like folder <out>/class_NNN/img_NNNNNNN.jpg "
            "from random crops of the real photos in sample_data/."
        )
    )
    parser.add_argument("--n", type=int, required=True, help="number of images")
    parser.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--size",
        type=_parse_size,
        default=(500, 375),
        help="nominal WIDTHxHEIGHT that sizes vary around (default 500x375)",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=DEFAULT_SOURCE,
        help=f"folder of source photos (default {DEFAULT_SOURCE})",
    )
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default min(2, CPUs))")
    parser.add_argument(
        "--force",
        action="store_true",
        help="regenerate even if --out is up to date; allow a non-empty foreign --out",
    )
    args = parser.parse_args(argv)
    try:
        make_bench_folder(
            args.out,
            n=args.n,
            classes=args.classes,
            seed=args.seed,
            size=args.size,
            source=args.source,
            workers=args.workers,
            force=args.force,
            verbose=True,
        )
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"bench_data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
