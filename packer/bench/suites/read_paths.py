"""Reader throughput against the pure decode limit (issue: readers).

Packs the ImageNet-like folder to LMDB at 256 px JPEG, then measures, with 2 worker processes:
- limit:    the same JPEG bytes held in a Python list, decoded by the same decoder (simplejpeg)
            in 2 processes (a multiprocessing Pool), nothing else;
- iterable: open_iterable(decode="tensor") in a DataLoader(batch_size=64, num_workers=2);
- map:      open_dataset(decode="tensor") with DeterministicSampler in the same DataLoader;
- batch:    open_iterable(batch_size=64, crop=224): workers decode straight into shared-memory
            batches, DataLoader(batch_size=None) (the images vary in size, so a crop fixes it).
Workers are persistent (as in training). Also time to first batch (from building the loader,
starting the workers included) and the peak memory of the loader's process tree (packer.bench's
harness: the same timer and sampler as ``pack bench``).

    pack bench run read_paths --n 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import simplejpeg
from torch.utils.data import DataLoader

from packer.bench.baseline import collate_list
from packer.bench.bench_data import make_bench_folder
from packer.bench.contenders import batch_path, sample_path
from packer.bench.harness import MemorySampler, time_epochs
from packer.bench.prepare import ensure_packed
from readers import DeterministicSampler, open_dataset
from readers.formats.packed_sample import PreprocessSpec

_BLOBS: list[bytes] = []


def _decode_range(bounds: tuple[int, int]) -> int:
    for blob in _BLOBS[bounds[0] : bounds[1]]:
        simplejpeg.decode_jpeg(blob, colorspace="RGB")
    return bounds[1] - bounds[0]


def decode_limit(blobs: list[bytes], workers: int = 2) -> float:
    global _BLOBS
    _BLOBS = blobs
    step = 64
    ranges = [(i, min(len(blobs), i + step)) for i in range(0, len(blobs), step)]
    with get_context("fork").Pool(workers) as pool:
        pool.map(_decode_range, ranges[:workers])  # start-up outside the timing
        start = time.perf_counter()
        done = sum(pool.imap_unordered(_decode_range, ranges))
        return done / (time.perf_counter() - start)


def measured(build, epochs: int) -> dict[str, float]:
    """Median img/s of ``epochs`` timed epochs after a warm-up, first batch (from building the
    loader, workers included) and the peak memory of the process tree, for ``build()``'s loader."""
    with MemorySampler() as memory:
        started = time.perf_counter()
        loader, set_epoch = build()
        times = time_epochs(loader, epochs, set_epoch, started=started)
        del loader  # stops its persistent workers before the next contender
    return {
        "images_per_s": times.median,
        "first_batch_s": times.first_batch_s,
        "peak_rss_mb": memory.peak_rss / 1e6,
        "peak_pss_mb": (memory.peak_pss or memory.peak_rss) / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs after a warm-up (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--decode", default="tensor", help="tensor (shared memory transfer) or numpy (pickled)"
    )
    args = parser.parse_args()
    src = make_bench_folder(Path(f"/tmp/imgpack-bench/n{args.n}"), args.n)
    out = ensure_packed(src, f"/tmp/imgpack-bench/readers/lmdb{args.n}", "lmdb", PreprocessSpec(resize=256))
    ds = open_dataset(out, decode="bytes")
    blobs = [ds[i][0] for i in range(len(ds))]
    limit = decode_limit(blobs, args.workers)
    print(f"decode limit ({args.workers} processes): {limit:8.0f} img/s")

    def per_sample():
        options = {"shuffle": True, "seed": 0, "decode": args.decode}
        return sample_path(out, args.batch_size, args.workers, collate_list, **options)

    def map_style():
        mapped = open_dataset(out, decode=args.decode)
        sampler = DeterministicSampler(mapped, seed=0)
        loader = DataLoader(
            mapped,
            persistent_workers=True,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            collate_fn=collate_list,
        )
        return loader, sampler.set_epoch

    def batches():
        return batch_path(out, args.batch_size, args.workers, shuffle=True, seed=0, crop=224)

    iterable = measured(per_sample, args.epochs)
    map_style_ = measured(map_style, args.epochs)
    batched = measured(batches, args.epochs)
    # The limit is measured before and after the readers; the higher figure is the bar.
    limit = max(limit, decode_limit(blobs, args.workers))
    print(f"decode limit, best of two runs: {limit:8.0f} img/s")
    for name, r in (("iterable", iterable), ("map", map_style_), ("batch", batched)):
        print(
            f"{name:9s} {r['images_per_s']:8.0f} img/s = {r['images_per_s'] / limit:.2f}x limit, "
            f"first batch {r['first_batch_s']:.2f} s, peak PSS {r['peak_pss_mb']:.0f} MB "
            f"(RSS {r['peak_rss_mb']:.0f} MB)"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
