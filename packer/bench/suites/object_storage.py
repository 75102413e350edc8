"""Streaming a tar pack from object storage: imgpack with and without reading ahead, webdataset
over the same shards from URLs, a local warm read, and the server's whole-object GET rate.

The pack (``packer/bench/bench_data.py`` images, resized to 256, tar shards of ``--per-shard``
samples) is uploaded to a local S3 server (moto, in this process); each ``--delays`` value (ms)
puts a ``DelayProxy`` in front of it that delays every request, the round trip of a real store.
Every contender reads the batch path (centre crop, batch 64, ``--workers`` DataLoader workers,
a fresh loader per epoch, no cache unless named) and is timed for one epoch, in turns, ``--rounds`` times
(the order rotated each round); the table gives medians. "read-ahead off" sets
``IMGPACK_REMOTE_REQUESTS=0`` and reads only its first ``--off-batches`` batches (it is slow).
The ceiling is the server's rate for whole shards fetched by 8 threads, in images/s.

    pack bench run object_storage --n 4000 --rounds 3 --delays 0,30
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from packer.bench.peers import webdataset_loader

BUCKET = "bench"
CROP = 224
BATCH = 64


def timed_epoch(loader: Any, limit: int | None = None) -> tuple[int, float]:
    """(images, seconds) of one pass over ``loader`` (its first ``limit`` batches)."""
    images, started = 0, time.perf_counter()
    for i, batch in enumerate(loader):
        images += len(batch[1])
        if limit is not None and i + 1 >= limit:
            break
    return images, time.perf_counter() - started


@contextmanager
def env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def imgpack_loader(
    path: str, workers: int, storage: dict[str, Any] | None, cache_dir: str | None = None
) -> Any:
    from readers import make_loader, open_iterable

    remote: dict[str, Any] = {"storage_options": storage} if storage is not None else {}
    if cache_dir is not None:
        remote["cache_dir"] = cache_dir
    it = open_iterable(path, batch_size=BATCH, crop=CROP, seed=0, **remote)
    return make_loader(it, num_workers=workers)


def ceiling(fs: Any, paths: list[str], images: int) -> tuple[int, float]:
    """(images, seconds) for fetching every shard whole with 8 threads: the server's rate."""
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        for _ in pool.map(fs.cat_file, paths):
            pass
    return images, time.perf_counter() - started


def prepare(n: int, per_shard: int, root: Path) -> Path:
    from packer.bench.bench_data import make_bench_folder
    from packer.bench.prepare import ensure_packed
    from readers.formats.packed_sample import PreprocessSpec

    src = make_bench_folder(root / f"src-n{n}", n, 100)
    options = {"samples_per_shard": per_shard}
    return ensure_packed(
        src, root / f"tar-n{n}-s{per_shard}", "tar", PreprocessSpec(resize=256), options=options
    )


def contenders(
    local: Path, fs: Any, endpoint: str, storage: dict[str, Any], args: argparse.Namespace
) -> dict[str, Callable[[], tuple[int, float]]]:
    from readers.formats import open_reader

    manifest = open_reader(local).manifest
    shards = [f"{BUCKET}/ds/{s.file}" for s in manifest.shards]
    url = f"s3://{BUCKET}/ds"
    workers = args.workers

    def off() -> tuple[int, float]:
        with env(IMGPACK_REMOTE_REQUESTS="0"):
            return timed_epoch(imgpack_loader(url, workers, storage), args.off_batches)

    def first_cached() -> tuple[int, float]:
        import tempfile

        with tempfile.TemporaryDirectory() as cache:  # empty: the first epoch downloads every part
            return timed_epoch(imgpack_loader(url, workers, storage, cache))

    return {
        "imgpack remote": lambda: timed_epoch(imgpack_loader(url, workers, storage)),
        "imgpack remote, cache_dir first epoch": first_cached,
        "imgpack remote, read-ahead off": off,
        "webdataset remote": lambda: timed_epoch(
            webdataset_loader([fs.url(p, expires=3600) for p in shards], workers, BATCH, CROP)
        ),
        "imgpack local warm": lambda: timed_epoch(imgpack_loader(str(local), workers, None)),
        "server ceiling (whole GETs)": lambda: ceiling(fs, shards, manifest.num_samples),
    }


@contextmanager
def s3rver(bucket: str, binary: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """An s3rver (Node.js) S3 server on 127.0.0.1 with an empty ``bucket``: (s3fs, storage_options)."""
    import subprocess
    import tempfile
    import urllib.request

    import s3fs

    from packer.bench.s3server import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        command = [str(binary), "-d", data, "-a", "127.0.0.1", "-p", str(port), "--silent"]
        proc = subprocess.Popen([*command, "--configure-bucket", bucket], stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{binary}: the s3rver server did not start") from None
                    time.sleep(0.2)
            options = {
                "key": "S3RVER",
                "secret": "S3RVER",
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
            }
            yield s3fs.S3FileSystem(skip_instance_cache=True, **options), options
        finally:
            proc.kill()
            proc.wait()


def server(args: argparse.Namespace) -> Any:
    if args.server == "s3rver":
        return s3rver(BUCKET, args.s3rver)
    from packer.bench.s3server import moto_s3

    return moto_s3(BUCKET)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from packer.bench.delay_proxy import delayed

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    local = prepare(args.n, args.per_shard, args.root)
    rows = []
    with server(args) as (fs, storage):
        fs.put(str(local) + "/", f"{BUCKET}/ds", recursive=True)
        direct = storage["client_kwargs"]["endpoint_url"]
        for delay in args.delays:
            proxy = delayed(direct, delay / 1000) if delay else nullcontext(None)
            with proxy as p:
                endpoint = p.endpoint if p is not None else direct
                options = {**storage, "client_kwargs": {"endpoint_url": endpoint}}
                import s3fs

                through = s3fs.S3FileSystem(skip_instance_cache=True, **options)
                runs = contenders(local, through, endpoint, options, args)
                rates: dict[str, list[float]] = {name: [] for name in runs}
                names = list(runs)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        images, seconds = runs[name]()
                        rates[name].append(images / seconds)
                row = {"delay_ms": delay, **{k: round(statistics.median(v)) for k, v in rates.items()}}
                row["rounds"] = {k: [round(x) for x in v] for k, v in rates.items()}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    names = [k for k in rows[0] if k not in ("delay_ms", "rounds")]
    lines = [
        "| img/s | " + " | ".join(f"{r['delay_ms']} ms" for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{r[name]:,}" for r in rows) + " |")
    for r in rows:
        best = min(r["imgpack local warm"], r["server ceiling (whole GETs)"])
        r["ratios"] = {
            "vs min(local, ceiling)": round(r["imgpack remote"] / best, 2),
            "vs webdataset": round(r["imgpack remote"] / r["webdataset remote"], 2),
            "vs read-ahead off": round(r["imgpack remote"] / r["imgpack remote, read-ahead off"], 1),
        }
    for key in rows[0]["ratios"]:
        lines.append(f"| imgpack remote {key} | " + " | ".join(f"{r['ratios'][key]}x" for r in rows) + " |")
    conditions = (
        f"{args.n} images at 256 px in tar shards of {args.per_shard}, {args.server} S3 on 127.0.0.1, "
        f"batch {BATCH}, crop {CROP}, {args.workers} workers, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} rounds"
    )
    return conditions + "\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", type=lambda s: [int(x) for x in s.split(",")], default=[0, 30])
    parser.add_argument("--off-batches", type=int, default=8)
    parser.add_argument("--server", choices=("moto", "s3rver"), default="moto")
    parser.add_argument(
        "--s3rver", type=Path, default=Path("/work/peers/s3rver/node_modules/.bin/s3rver"),
        help="the s3rver binary (npm install s3rver)",
    )  # fmt: skip
    parser.add_argument("--root", type=Path, default=Path("/tmp/imgpack-bench/object-storage"))
    args = parser.parse_args(argv)
    print(table(run(args), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
