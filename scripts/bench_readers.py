"""Reader throughput against the pure decode limit (issue: readers).

Packs the ImageNet-like folder to LMDB at 256 px JPEG, then measures, with 2 worker processes:
- limit:    the same JPEG bytes held in a Python list, decoded by the same decoder (simplejpeg)
            in 2 processes (a multiprocessing Pool), nothing else;
- iterable: open_iterable(decode="tensor") in a DataLoader(batch_size=64, num_workers=2);
- map:      open_dataset(decode="tensor") with DeterministicSampler in the same DataLoader;
- batch:    open_iterable(batch_size=64, crop=224): workers decode straight into shared-memory
            batches, DataLoader(batch_size=None) (the images vary in size, so a crop fixes it).
Workers are persistent (as in training). Also time to first batch (warm-up epoch, including
starting the workers) and the loader's RSS at the start and end of a timed epoch.

    python scripts/bench_readers.py --n 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import simplejpeg  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packer.engine import pack_folder  # noqa: E402
from packer.preprocess import PreprocessSpec  # noqa: E402
from readers import DeterministicSampler, open_dataset, open_iterable  # noqa: E402
from scripts.make_bench_data import make_bench_folder  # noqa: E402
from scripts.proctree import tree_rss  # noqa: E402

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


def timed_epochs(loader, epochs: int, set_epoch, batch_of=len) -> dict[str, float]:
    me = psutil.Process()
    result: dict[str, float] = {}
    rates = []
    first_batch = 0.0
    for epoch in range(epochs + 1):  # epoch 0 warms the page cache and starts the workers
        set_epoch(epoch)
        start = time.perf_counter()
        first = None
        count = 0
        rss = []
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            count += batch_of(batch)
            if count % 640 < 64:
                rss.append(tree_rss(me))
        seconds = time.perf_counter() - start
        if epoch == 0:
            first_batch = first  # includes starting the (persistent) workers
        else:
            rates.append(count / seconds)
            result = {
                "images_per_s": float(np.median(rates)),
                "first_batch_s": first_batch,
                "rss_start_mb": rss[0] / 1e6,
                "rss_end_mb": rss[-1] / 1e6,
            }
    return result


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
    out = Path(f"/tmp/imgpack-bench/readers/lmdb{args.n}")
    if not (out / "manifest.json").exists():
        pack_folder(src, out, "lmdb", PreprocessSpec(resize=256), workers=2, force=True)
    ds = open_dataset(out, decode="bytes")
    blobs = [ds[i][0] for i in range(len(ds))]
    limit = decode_limit(blobs, args.workers)
    print(f"decode limit ({args.workers} processes): {limit:8.0f} img/s")

    def keep_list(batch):
        return batch

    it = open_iterable(out, shuffle=True, seed=0, decode=args.decode)
    loader = DataLoader(
        it,
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=keep_list,
        persistent_workers=True,
    )
    iterable = timed_epochs(loader, args.epochs, it.set_epoch)
    del loader  # stops its persistent workers before the next contender
    mapped = open_dataset(out, decode=args.decode)
    sampler = DeterministicSampler(mapped, seed=0)
    map_loader = DataLoader(
        mapped,
        persistent_workers=True,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=keep_list,
    )
    map_style = timed_epochs(map_loader, args.epochs, sampler.set_epoch)
    del map_loader
    batch_it = open_iterable(out, shuffle=True, seed=0, batch_size=args.batch_size, crop=224)
    batch_loader = DataLoader(batch_it, batch_size=None, num_workers=args.workers, persistent_workers=True)
    batched = timed_epochs(batch_loader, args.epochs, batch_it.set_epoch, batch_of=lambda b: len(b[0]))
    del batch_loader
    # The limit is measured before and after the readers; the higher figure is the bar.
    limit = max(limit, decode_limit(blobs, args.workers))
    print(f"decode limit, best of two runs: {limit:8.0f} img/s")
    for name, r in (("iterable", iterable), ("map", map_style), ("batch", batched)):
        print(
            f"{name:9s} {r['images_per_s']:8.0f} img/s = {r['images_per_s'] / limit:.2f}x limit, "
            f"first batch {r['first_batch_s']:.2f} s, RSS {r['rss_start_mb']:.0f} -> {r['rss_end_mb']:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
