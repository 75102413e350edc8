"""A tar pack streamed from object storage by imgpack, webdataset, LitData and Streaming.

imgpack with read-ahead on and off and through a cache_dir, webdataset over the same shards from
URLs, LitData and Streaming from their own formats in the same bucket, a local warm read, and the
server's whole-object GET rate.

The pack (``packer/bench/bench_data.py`` images, resized to 256, tar shards of ``--per-shard``
samples) is uploaded to a local S3 server (moto, in this process); each ``--delays`` value (ms)
puts a ``DelayProxy`` in front of it that delays every request, the round trip of a real store.
Every contender reads the batch path (centre crop, batch 64, ``--workers`` DataLoader workers,
a fresh loader per epoch, no cache unless named) and is timed for one epoch, in turns, ``--rounds`` times
(the order rotated each round); the table gives medians. "read-ahead off" sets
``IMGPACK_REMOTE_REQUESTS=0`` and reads only its first ``--off-batches`` batches (it is slow).
The ceiling is the server's rate for whole shards fetched by 8 threads, in images/s.

LitData and MosaicML Streaming stream their own formats of the same images (the tar pack's stored
JPEGs and labels, exported once into chunks about as big as its shards, uploaded to the same
bucket) through the same proxy, each in a fresh process of its own Python (``--litdata-python``,
``--streaming-python``: venvs with the peer, never dependencies of imgpack), one epoch into an
empty cache directory (``packer/bench/suites/object_storage_child.py``). A peer whose Python is
missing is left out, with a line saying so. "imgpack remote, fresh process" reads as the peers do:
a fresh process each epoch (the suite's Python), timed from building the loader. The other
imgpack rows run in this long-lived process, where imports, clients and sessions are warm, as in
the second and later epochs of a training script; a peer's epoch pays its process's first uses.

    pack bench run object_storage --n 4000 --rounds 3 --delays 0,30
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple

from packer.bench.peers import webdataset_loader
from packer.bench.suites.object_storage_child import PEERS

BUCKET = "bench"
CROP = 224
BATCH = 64
# Started as a file under each peer's Python, which has none of imgpack's dependencies.
CHILD = Path(__file__).with_name("object_storage_child.py")
PEER_PYTHONS = {peer: Path(f"/work/peers/{peer}-venv/bin/python") for peer in PEERS}


class Epoch(NamedTuple):
    """One timed epoch: its images and seconds, and those of its first batch (the start of the
    epoch's workers, connections and plans: once per epoch here, once per run in training)."""

    images: int
    seconds: float
    first_images: int = 0
    first_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.images / self.seconds

    @property
    def steady(self) -> float:
        """Images/s after the first batch (the whole epoch's where it has one batch)."""
        rest, span = self.images - self.first_images, self.seconds - self.first_seconds
        return rest / span if rest > 0 and span > 0 else self.rate


def timed_epoch(loader: Any, limit: int | None = None) -> Epoch:
    """One pass over ``loader`` (its first ``limit`` batches), timed."""
    images, first, started = 0, (0, 0.0), time.perf_counter()
    for i, batch in enumerate(loader):
        images += len(batch[1])
        if i == 0:
            first = (images, time.perf_counter() - started)
        if limit is not None and i + 1 >= limit:
            break
    return Epoch(images, time.perf_counter() - started, *first)


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


def ceiling(fs: Any, paths: list[str], images: int) -> Epoch:
    """Every shard fetched whole with 8 threads, counted in images: the server's rate."""
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        for _ in pool.map(fs.cat_file, paths):
            pass
    return Epoch(images, time.perf_counter() - started)


def prepare(n: int, per_shard: int, root: Path) -> Path:
    from packer.bench.bench_data import make_bench_folder
    from packer.bench.prepare import ensure_packed
    from readers.formats.packed_sample import PreprocessSpec

    src = make_bench_folder(root / f"src-n{n}", n, 100)
    options = {"samples_per_shard": per_shard}
    return ensure_packed(
        src, root / f"tar-n{n}-s{per_shard}", "tar", PreprocessSpec(resize=256), options=options
    )


def peer_pythons(args: argparse.Namespace) -> dict[str, Path]:
    """{peer: its Python} for each peer whose Python is there; one line for each that is not."""
    found = {}
    for peer in PEERS:
        python: Path = getattr(args, f"{peer}_python")
        if python.exists():
            found[peer] = python
        else:
            print(
                f"{peer} remote: left out: no Python at {python} "
                f"(make its venv, see docs/object-storage.md, or pass --{peer}-python)",
                flush=True,
            )
    return found


def child_env(storage: dict[str, Any]) -> dict[str, str]:
    """The environment of a peer's child: credentials of ``storage``, none of imgpack's paths."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AWS_ACCESS_KEY_ID"] = storage.get("key") or os.environ.get("AWS_ACCESS_KEY_ID", "")
    env["AWS_SECRET_ACCESS_KEY"] = storage.get("secret") or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    return env


def run_child(python: Path, args: list[str], env: dict[str, str] | None = None) -> str:
    """``python -I object_storage_child.py ARGS`` (isolated: the peer's venv and the standard
    library only, not the suites' folder): its standard output; its failure is an error carrying
    the end of its standard error."""
    command = [str(python), "-I", str(CHILD), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def export_peer(peer: str, python: Path, local: Path, root: Path) -> Path:
    """The tar pack ``local`` in ``peer``'s format under ``root`` (made once, reused after)."""
    import shutil

    out = root / f"{peer}-{local.name}"
    if not out.exists():
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        run_child(python, ["write", peer, "--pack", str(local), "--out", str(partial)])
        partial.rename(out)
    return out


def peer_epoch(
    peer: str,
    python: Path,
    endpoint: str,
    storage: dict[str, Any],
    workers: int,
    expected: int,
    prefix: str | None = None,
) -> Epoch:
    """One epoch of ``peer`` streaming its upload at ``s3://bench/PREFIX`` (the peer's name)."""
    url = f"s3://{BUCKET}/{prefix or peer}"
    read = ["read", peer, "--url", url, "--endpoint", endpoint, "--workers", str(workers)]
    line = run_child(python, read, child_env(storage)).strip().splitlines()[-1]
    result = json.loads(line)
    if result["distinct"] != expected:
        raise RuntimeError(f"{peer} read {result['distinct']} distinct images of {expected}: {line}")
    first = (result.get("first_batch_images", 0), result.get("first_batch_s", 0.0))
    return Epoch(result["images"], result["seconds"], *first)


def contenders(
    local: Path,
    fs: Any,
    endpoint: str,
    storage: dict[str, Any],
    args: argparse.Namespace,
    peers: dict[str, Path] | None = None,
) -> dict[str, Callable[[], Epoch]]:
    from readers.formats import open_reader

    manifest = open_reader(local).manifest
    shards = [f"{BUCKET}/ds/{s.file}" for s in manifest.shards]
    url = f"s3://{BUCKET}/ds"
    workers = args.workers

    def off() -> Epoch:
        with env(IMGPACK_REMOTE_REQUESTS="0"):
            return timed_epoch(imgpack_loader(url, workers, storage), args.off_batches)

    def first_cached() -> Epoch:
        import tempfile

        with tempfile.TemporaryDirectory() as cache:  # empty: the first epoch downloads every part
            return timed_epoch(imgpack_loader(url, workers, storage, cache))

    def peer(name: str, python: Path) -> Callable[[], Epoch]:
        return lambda: peer_epoch(name, python, endpoint, storage, workers, manifest.num_samples)

    return {
        "imgpack remote": lambda: timed_epoch(imgpack_loader(url, workers, storage)),
        "imgpack remote, cache_dir first epoch": first_cached,
        "imgpack remote, read-ahead off": off,
        "webdataset remote": lambda: timed_epoch(
            webdataset_loader([fs.url(p, expires=3600) for p in shards], workers, BATCH, CROP)
        ),
        FRESH: lambda: peer_epoch(
            "imgpack", Path(sys.executable), endpoint, storage, workers, manifest.num_samples, "ds"
        ),
        **{f"{name} remote": peer(name, python) for name, python in (peers or {}).items()},
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
    peers = peer_pythons(args)
    exported = {peer: export_peer(peer, python, local, args.root) for peer, python in peers.items()}
    rows = []
    # Each delay's filesystem stays referenced to the end: dropped, it can still be uncollected
    # garbage when the next loader forks its workers, and a worker that collects it closes its
    # connections on the worker's own event loop ("Task exception was never retrieved ...
    # attached to a different loop" on stderr).
    kept: list[Any] = []
    with server(args) as (fs, storage):
        fs.put(str(local) + "/", f"{BUCKET}/ds", recursive=True)
        for peer, out in exported.items():
            fs.put(str(out) + "/", f"{BUCKET}/{peer}", recursive=True)
        direct = storage["client_kwargs"]["endpoint_url"]
        for delay in args.delays:
            proxy = delayed(direct, delay / 1000) if delay else nullcontext(None)
            with proxy as p:
                endpoint = p.endpoint if p is not None else direct
                options = {**storage, "client_kwargs": {"endpoint_url": endpoint}}
                import s3fs

                through = s3fs.S3FileSystem(skip_instance_cache=True, **options)
                kept.append(through)
                runs = contenders(local, through, endpoint, options, args, peers)
                epochs: dict[str, list[Epoch]] = {name: [] for name in runs}
                names = list(runs)
                for r in range(args.rounds):
                    for name in names[r % len(names) :] + names[: r % len(names)]:
                        epochs[name].append(runs[name]())
                row: dict[str, Any] = {
                    "delay_ms": delay,
                    **{k: round(statistics.median(e.rate for e in v)) for k, v in epochs.items()},
                }
                row["steady"] = {k: round(statistics.median(e.steady for e in v)) for k, v in epochs.items()}
                row["rounds"] = {k: [round(e.rate) for e in v] for k, v in epochs.items()}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


FRESH = "imgpack remote, fresh process"
PEER_ROWS = ("webdataset remote", *(f"{peer} remote" for peer in PEERS))  # "best peer" is one of them


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The whole-epoch rates and their ratios; then, where the rows have them, the rates after
    each epoch's first batch (the pace of a long epoch) and theirs."""
    blocks = [("img/s, whole epoch", rows)]
    if all("steady" in r for r in rows):
        after = [{"delay_ms": r["delay_ms"], **r["steady"]} for r in rows]
        blocks.append(("img/s after the first batch", after))
    conditions = (
        f"{args.n} images at 256 px in tar shards of {args.per_shard}, {args.server} S3 on 127.0.0.1, "
        f"batch {BATCH}, crop {CROP}, {args.workers} workers, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} rounds"
    )
    return conditions + "\n\n" + "\n\n".join(_block(title, block) for title, block in blocks)


def _block(title: str, rows: list[dict[str, Any]]) -> str:
    names = [k for k in rows[0] if k not in ("delay_ms", "rounds", "steady", "ratios")]
    lines = [
        f"| {title} | " + " | ".join(f"{r['delay_ms']} ms" for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{r[name]:,}" for r in rows) + " |")
    ratios = [_ratios(r) for r in rows]
    for key in ratios[0]:
        lines.append(f"| imgpack remote {key} | " + " | ".join(r[key] for r in ratios) + " |")
    return "\n".join(lines)


def _ratios(r: dict[str, Any]) -> dict[str, str]:
    best = min(r["imgpack local warm"], r["server ceiling (whole GETs)"])
    peer = max((k for k in r if k in PEER_ROWS), key=lambda k: r[k])
    name = peer.removesuffix(" remote")
    ratios = {
        "vs min(local, ceiling)": f"{r['imgpack remote'] / best:.2f}x",
        "vs webdataset": f"{r['imgpack remote'] / r['webdataset remote']:.2f}x",
        "vs best peer": f"{r['imgpack remote'] / r[peer]:.2f}x ({name})",
        "vs read-ahead off": f"{r['imgpack remote'] / r['imgpack remote, read-ahead off']:.1f}x",
    }
    if FRESH in r:  # as the peers run: a fresh process each epoch, timed from building the loader
        ratios["(fresh process) vs best peer"] = f"{r[FRESH] / r[peer]:.2f}x ({name})"
    return ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000, help="images in the benchmark pack (default 4000)")
    parser.add_argument("--per-shard", type=int, default=500, help="images per tar shard (default 500)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of every contender")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, contenders in turn; medians reported")
    parser.add_argument(
        "--delays", type=lambda s: [int(x) for x in s.split(",")], default=[0, 30],
        help="milliseconds a proxy adds to every request, one run each (default 0,30)",
    )  # fmt: skip
    parser.add_argument(
        "--off-batches", type=int, default=8,
        help="batches timed with read-ahead off (one request at a time: a whole epoch would take long)",
    )  # fmt: skip
    parser.add_argument(
        "--server", choices=("moto", "s3rver"), default="moto",
        help="the local S3 server: moto (Python, in the tests) or s3rver (Node.js, ~3x faster)",
    )  # fmt: skip
    parser.add_argument(
        "--s3rver", type=Path, default=Path("/work/peers/s3rver/node_modules/.bin/s3rver"),
        help="the s3rver binary (npm install s3rver)",
    )  # fmt: skip
    for peer, python in PEER_PYTHONS.items():
        parser.add_argument(
            f"--{peer}-python", type=Path, default=python,
            help=f"a Python with {peer} installed (left out if missing; docs/object-storage.md)",
        )  # fmt: skip
    parser.add_argument(
        "--root", type=Path, default=Path("/tmp/imgpack-bench/object-storage"),
        help="where the images, the pack and the peers' copies are made (kept for the next run)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(table(run(args), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
