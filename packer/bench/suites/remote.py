#!/usr/bin/env python3
"""Remote reads vs local, and ``pack verify`` workers, on packed datasets (one run each).

For each DATASET (a local packed directory): start a moto S3 server on 127.0.0.1, upload it, and
time (1) the first open, open_dataset and the first sample (remote: downloading its part into an
empty cache), (2) a full sequential read of every record's bytes (remote: the rest of the parts
downloaded during the read, then again with the cache warm), and (3) ``verify_dataset`` with 1
and with N workers (local). Prints a JSON object per dataset; the ratios are what to compare.

    pack bench run remote /tmp/rr-bench/lmdb /tmp/rr-bench/hdf5 --workers 2
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from packer.info.verify import verify_dataset
from readers import open_dataset

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def read_all(ds) -> int:
    reader, total = ds.reader, 0
    for start in range(0, len(reader), 256):
        total += sum(len(r.data) for r in reader.read_block(start, min(len(reader), start + 256)))
    return total


def first_open(path, **options):
    """open_dataset and its first sample (remote: its part downloaded into an empty cache)."""
    ds = open_dataset(path, decode="bytes", **options)
    ds[0]
    return ds


def bench(path: Path, url: str, options: dict, workers: int) -> dict:
    result: dict = {"dataset": str(path)}
    first_local, local = timed(lambda: first_open(path))
    with tempfile.TemporaryDirectory() as cache:
        remote_options = {"storage_options": options, "cache_dir": cache}
        first_remote, remote = timed(lambda: first_open(url, **remote_options))
        cold, got = timed(lambda: read_all(remote))
        warm_open, warm = timed(lambda: open_dataset(url, decode="bytes", **remote_options))
        warm_read, _ = timed(lambda: read_all(warm))
    local_read, want = timed(lambda: read_all(local))
    assert got == want, "remote and local reads differ"
    n = len(local)
    result.update(
        samples=n,
        first_open_s={"local": round(first_local, 3), "remote": round(first_remote, 3)},
        first_open_ratio=round(first_remote / first_local, 1),
        read_img_s={
            "local": round(n / local_read),
            "remote_cold": round(n / cold),
            "remote_cached": round(n / (warm_open + warm_read)),
        },
        cold_read_slowdown=round(cold / local_read, 1),
        cached_read_ratio=round((warm_open + warm_read) / local_read, 2),
    )
    one, report1 = timed(lambda: verify_dataset(path, workers=1))
    many, report_n = timed(lambda: verify_dataset(path, workers=workers))
    assert report1.problems == report_n.problems
    result.update(verify_s={"1": round(one, 2), str(workers): round(many, 2)})
    result.update(verify_speedup=round(one / many, 2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from packer.bench.s3server import moto_s3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    with moto_s3("bench") as (fs, options):
        for i, path in enumerate(args.datasets):
            fs.put(str(path) + "/", f"bench/ds{i}", recursive=True)
            print(json.dumps(bench(path, f"s3://bench/ds{i}", options, args.workers)), flush=True)

if __name__ == "__main__":
    main()
