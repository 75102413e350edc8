#!/usr/bin/env python3
"""Packing throughput: local folder -> local folder, s3:// -> s3:// (a moto server on this machine),
and s3:// -> s3:// with ``--engine ray`` (a local Ray cluster), on the same ImageNet-like folder.

Each row packs the whole folder once into a fresh output and reports images/s of the pack itself
(the Ray cluster's start is not counted; the moto server shares this machine's CPUs with the
packer, so the S3 rows are a lower bound of what a real object store gives).

Usage::

    pack bench run remote_pack --n 400 --to tar --resize 256 --workers 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.bench.bench_data import make_bench_folder
from packer.bench.s3server import free_port
from packer.engine.pack_run import pack_folder
from readers.formats.packed_sample import PreprocessSpec

if TYPE_CHECKING:
    import s3fs

BUCKET = "imgpack-bench"


def start_s3() -> tuple[subprocess.Popen[bytes], s3fs.S3FileSystem, dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 in its own process (so it does not share the packer's GIL):
    (server process, s3fs filesystem, storage_options)."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import s3fs

    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    # moto answers a rare 500 under many concurrent requests; retry those as one would for S3.
    options["config_kwargs"] = {"retries": {"max_attempts": 5, "mode": "standard"}}
    for _ in range(200):
        try:
            fs.mkdir(BUCKET)
            break
        except OSError:
            time.sleep(0.1)  # the server is still starting
    return server, fs, options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="images in the generated folder")
    parser.add_argument("--to", default="tar", help="output format")
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray row")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-remote-pack-"))
    src = work / "src"
    make_bench_folder(src, n=args.n, classes=10, seed=0)
    server, fs, storage = start_s3()
    fs.put(str(src) + "/", f"{BUCKET}/src", recursive=True)
    spec = PreprocessSpec(resize=args.resize)
    options = {"shards": args.shards}
    rows: list[tuple[str, float]] = []

    import psutil

    moto = psutil.Process(server.pid)

    def run(name: str, source: str, out: str, **kwargs) -> None:
        started, served = time.perf_counter(), sum(moto.cpu_times()[:2])
        report = pack_folder(source, out, args.to, spec, options=options, storage_options=storage, **kwargs)
        seconds = time.perf_counter() - started
        served = sum(moto.cpu_times()[:2]) - served
        rows.append((name, report.packed / seconds))
        print(
            f"{name:<28} {report.packed} images in {seconds:6.2f} s = {report.packed / seconds:7.1f} img/s "
            f"(the S3 server used {served:5.2f} CPU s of it)"
        )

    try:
        run("local -> local", str(src), str(work / "out-local"), workers=args.workers)
        run("s3 -> local", f"s3://{BUCKET}/src", str(work / "out-from-s3"), workers=args.workers)
        run("local -> s3", str(src), f"s3://{BUCKET}/out-to-s3", workers=args.workers)
        run("s3 -> s3 (local engine)", f"s3://{BUCKET}/src", f"s3://{BUCKET}/out-s3", workers=args.workers)
        if not args.no_ray:
            import ray

            ray.init(
                num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False
            )
            try:
                run("s3 -> s3 (ray)", f"s3://{BUCKET}/src", f"s3://{BUCKET}/out-ray", engine="ray")
            finally:
                ray.shutdown()
    finally:
        server.terminate()
        server.wait()
    base = rows[0][1]
    print("ratios to local -> local: " + ", ".join(f"{name} {rate / base:.2f}x" for name, rate in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
