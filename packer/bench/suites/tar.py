"""Benchmark imgpack's tar format against the plain webdataset library.

1. Packing: ``pack_folder(..., "tar")`` against a straightforward single-process script driving
   ``webdataset.ShardWriter`` (Pillow decode, resize shorter side to 256, centre crop 256, JPEG q90).
2. Reading the same 256 px JPEG shards (imgpack's), 2 DataLoader workers, batch 64, uint8 output,
   the same decoder (simplejpeg) on both sides: imgpack's iterable reader against
   ``webdataset.WebDataset(...).batched(64)``. Both unshuffled (sequential), and both shuffled.

    pack bench run tar --src /tmp/imgpack-bench/n2000 --out /tmp/imgpack-bench/tar --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packer.bench.contenders import batch_path
from packer.bench.harness import EpochTimes, time_epoch

SIZE = 256
BATCH = 64
WORKERS = 2


# -- packing -------------------------------------------------------------------------------------


def pack_imgpack(src: Path, out: Path, per_shard: int, workers: int) -> float:
    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    spec = PreprocessSpec(resize=SIZE, crop=SIZE, quality=90)
    pack_folder(src, out, "tar", spec, workers=workers, options={"samples_per_shard": per_shard})
    return time.perf_counter() - started


def pack_webdataset(src: Path, out: Path, per_shard: int) -> float:
    """What a user would write by hand: one process, Pillow all the way, ShardWriter."""
    import webdataset as wds

    from packer.bench.prepare import naive_jpeg

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    classes = sorted(d.name for d in src.iterdir() if d.is_dir())
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        index = 0
        for label, name in enumerate(classes):
            for path in sorted((src / name).iterdir()):
                jpeg = naive_jpeg(path, SIZE, SIZE, Image.Resampling.BILINEAR)
                sink.write({"__key__": f"s{index:09d}", "jpg": jpeg, "cls": label})
                index += 1
    return time.perf_counter() - started


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (pool workers), user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pack_both(args: argparse.Namespace, n_images: int, shards: Path) -> dict:
    """Alternate the two packers (load on a shared machine drifts); medians of wall and CPU time."""
    walls: dict[str, list[float]] = {"imgpack": [], "shardwriter": []}
    cpus: dict[str, list[float]] = {"imgpack": [], "shardwriter": []}
    for _ in range(args.pack_repeats):
        for name in walls:
            before = cpu_seconds()
            if name == "imgpack":
                wall = pack_imgpack(args.src, shards, args.per_shard, args.pack_workers)
            else:
                wall = pack_webdataset(args.src, args.out / "shardwriter", args.per_shard)
            walls[name].append(wall)
            cpus[name].append(cpu_seconds() - before)
    ours, theirs = statistics.median(walls["imgpack"]), statistics.median(walls["shardwriter"])
    print(
        f"pack: imgpack {n_images / ours:.0f} img/s ({args.pack_workers} workers), ShardWriter script "
        f"{n_images / theirs:.0f} img/s -> {theirs / ours:.2f}x (runs: {walls})"
    )
    return {
        "imgpack_img_s": n_images / ours,
        "webdataset_shardwriter_img_s": n_images / theirs,
        "ratio": theirs / ours,
        "imgpack_workers": args.pack_workers,
        "wall_s": walls,
        "cpu_s": cpus,
        "cpu_ratio": statistics.median(cpus["shardwriter"]) / statistics.median(cpus["imgpack"]),
    }


# -- reading -------------------------------------------------------------------------------------


def decode_jpeg(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


def webdataset_loader(root: Path, shuffle: bool) -> DataLoader:
    import webdataset as wds

    urls = sorted(str(p) for p in root.glob("shard-*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, seed=0 if shuffle else None)
    if shuffle:
        ds = ds.shuffle(1000)
    ds = ds.to_tuple("jpg", "cls").map_tuple(decode_jpeg, int).batched(BATCH, partial=True)
    return DataLoader(ds, batch_size=None, num_workers=WORKERS)


def imgpack_loader(root: Path, shuffle: bool) -> DataLoader:
    return batch_path(root, BATCH, WORKERS, shuffle=shuffle, seed=0, layout="HWC")[0]


def checked_count(batch) -> int:
    images, labels = batch
    assert images.dtype == torch.uint8 and images.shape[1:] == (SIZE, SIZE, 3), images.shape
    return len(labels)


def epoch_rate(make_loader, root: Path, shuffle: bool, epochs: int) -> tuple[float, int]:
    """Median img/s over ``epochs`` epochs, each with a new loader, after one warm-up epoch (page
    cache, imports); and the images of the last epoch."""
    times = EpochTimes()
    for _ in range(epochs + 1):
        time_epoch(make_loader(root, shuffle), times, time.perf_counter(), checked_count)
    return times.median, times.images[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", type=Path, default=Path("/tmp/imgpack-bench/n2000"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/imgpack-bench/tar"))
    parser.add_argument("--per-shard", type=int, default=250)
    parser.add_argument("--pack-workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--pack-repeats", type=int, default=2, help="Alternating pack runs (median).")
    parser.add_argument("--skip-pack", action="store_true", help="Reuse shards packed by an earlier run.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    n_images = sum(1 for _ in args.src.glob("*/*"))
    results: dict = {"images": n_images, "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    shards = args.out / "imgpack"
    if not args.skip_pack:
        results["pack"] = pack_both(args, n_images, shards)
    results["read"] = {}
    for shuffle in (False, True):
        ours, n1 = epoch_rate(imgpack_loader, shards, shuffle, args.epochs)
        theirs, n2 = epoch_rate(webdataset_loader, shards, shuffle, args.epochs)
        assert n1 == n2 == n_images, (n1, n2, n_images)
        key = "shuffled" if shuffle else "sequential"
        results["read"][key] = {"imgpack_img_s": ours, "webdataset_img_s": theirs, "ratio": ours / theirs}
        print(
            f"read ({key}): imgpack {ours:.0f} img/s, webdataset {theirs:.0f} img/s -> {ours / theirs:.2f}x"
        )
    results["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
