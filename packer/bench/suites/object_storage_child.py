"""The child side of the ``object_storage`` suite for the peers that stream their own format:
LitData (``litdata``: chunks written by ``litdata.optimize``, read by its ``StreamingDataset`` and
``StreamingDataLoader``) and MosaicML Streaming (``mosaicml-streaming``: MDS shards written by
``MDSWriter``, read by its ``StreamingDataset`` and a plain ``DataLoader``).

It runs under each peer's own Python (``--litdata-python``, ``--streaming-python``), which has
none of imgpack's dependencies: the standard library only at import, the peer inside the
functions, and it is started as a file (``python object_storage_child.py``), never through the
``packer`` package.

- ``write PEER --pack DIR --out DIR``: the imgpack tar pack's stored JPEG bytes and labels, as they
  are (no re-encoding: the readers are compared, not the codecs), into the peer's format, chunks of
  about the pack's largest shard in bytes, with each sample's index so a read can count distinct
  samples.
- ``read PEER|imgpack --url s3://bucket/prefix --endpoint URL --workers W``: one epoch streamed from the
  server (credentials from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``) into a fresh empty cache
  directory, shuffled by the peer's default algorithm, simplejpeg decode, centre crop, batch 64;
  timed from building the loader to its last batch (the dataset, which fetches the peer's index,
  is made before, as the suite opens imgpack's manifest before its timer); one JSON line out:
  ``{"images": N, "distinct": D, "seconds": S}``. ``imgpack`` reads the imgpack tar pack the same
  way under the suite's own Python: the suite runs its other imgpack rows in its own long-lived
  process, where clients, sessions and imports are warm, while each peer's epoch pays its
  process's first-use costs.
"""

from __future__ import annotations

import argparse
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PEERS = ("litdata", "streaming")
CROP = 224
BATCH = 64


def pack_shards(pack: Path) -> list[tuple[str, int, int]]:
    """(path, first index, count) of each shard of an imgpack tar pack, from its manifest."""
    manifest = json.loads((pack / "manifest.json").read_text())
    return [(str(pack / s["file"]), int(s["first"]), int(s["count"])) for s in manifest["shards"]]


def shard_samples(shard: tuple[str, int, int]) -> Iterator[tuple[int, bytes, int]]:
    """(index, stored JPEG bytes, label) of every sample of one tar shard (members ``<key>.jpg``,
    ``<key>.cls``; ``<key>.json`` is not needed), in the shard's order."""
    path, first, count = shard
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            key, _, ext = member.name.rpartition(".")
            data = tar.extractfile(member) if ext in ("jpg", "cls") else None
            if data is not None:
                members.setdefault(key, {})[ext] = data.read()
    if len(members) != count:
        raise ValueError(f"{path}: {len(members)} samples, the manifest says {count}: pack it again")
    for offset, (key, sample) in enumerate(members.items()):
        if set(sample) != {"jpg", "cls"}:
            raise ValueError(
                f"{path}: sample {key!r} has {sorted(sample)}, not a .jpg and a .cls: "
                "pack the images as JPEG tar (pack ... --to tar)"
            )
        yield first + offset, sample["jpg"], int(sample["cls"])


def tar_samples(pack: Path) -> Iterator[tuple[int, bytes, int]]:
    """Every sample of an imgpack tar pack, in its order: what ``write`` exports."""
    for shard in pack_shards(pack):
        yield from shard_samples(shard)


def chunk_bytes(pack: Path) -> int:
    """The largest tar shard's size: the peers' chunks are made about as big."""
    manifest = json.loads((pack / "manifest.json").read_text())
    return max(int(shard["bytes"]) for shard in manifest["shards"])


# -- write (under the peer's Python) ------------------------------------------------------------
def _streaming() -> Any:
    """The ``streaming`` package. It imports torchvision for its vision dataset classes only
    (``streaming.vision``: not used here); PyPI's torchvision wheel is a CUDA build that cannot load
    beside the CPU torch of the peer venv (its ``_C`` needs ``libc10_cuda.so``), so where it fails
    the two names ``streaming.vision`` takes from it are stood in for, and nothing else."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        import importlib.machinery
        import sys
        import types

        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms.functional"):
            module = sys.modules[name] = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # others look for one
        sys.modules["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        sys.modules["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
    import streaming

    return streaming


def _litdata_samples(shard: tuple[str, int, int]) -> Iterator[dict[str, Any]]:
    for index, jpeg, label in shard_samples(shard):
        yield {"jpg": jpeg, "cls": label, "index": index}


def write_litdata(pack: Path, out: Path) -> None:
    import litdata

    # One worker: the chunks hold the samples in the pack's order, as the tar shards do.
    litdata.optimize(
        fn=_litdata_samples,
        inputs=pack_shards(pack),
        output_dir=str(out),
        chunk_bytes=chunk_bytes(pack),
        num_workers=1,
        verbose=False,
    )


def write_streaming(pack: Path, out: Path) -> None:
    columns = {"jpg": "bytes", "cls": "int", "index": "int"}
    with _streaming().MDSWriter(out=str(out), columns=columns, size_limit=chunk_bytes(pack)) as writer:
        for index, jpeg, label in tar_samples(pack):
            writer.write({"jpg": jpeg, "cls": label, "index": index})


# -- read (under the peer's Python) -------------------------------------------------------------
def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """simplejpeg decode and centre crop, as the suite's webdataset contender does."""
    import simplejpeg

    image = simplejpeg.decode_jpeg(sample["jpg"])
    h, w = image.shape[:2]
    top, left = (h - CROP) // 2, (w - CROP) // 2
    image = image[top : top + CROP, left : left + CROP]
    return {"image": image, "cls": sample["cls"], "index": sample["index"]}


def litdata_loader(url: str, endpoint: str, workers: int, cache: str) -> Callable[[], Any]:
    import litdata
    from litdata.streaming import downloader

    # LitData GETs chunks with obstore, whose client options it fixes without ``allow_http``, so
    # a plain-http endpoint (the local server) is refused ("BadScheme") where https S3 is not:
    # allow it, keeping the path LitData takes on a real store.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    storage = {
        "endpoint_url": endpoint,
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    dataset = litdata.StreamingDataset(
        url, cache_dir=cache, shuffle=True, storage_options=storage, transform=decode
    )
    return lambda: litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers)


def streaming_loader(url: str, endpoint: str, workers: int, cache: str) -> Callable[[], Any]:
    import torch

    base: Any = _streaming().StreamingDataset
    os.environ["S3_ENDPOINT_URL"] = endpoint  # Streaming's S3 client reads it (workers inherit it)

    class Decoded(base):
        def __getitem__(self, index: int) -> dict[str, Any]:
            return decode(super().__getitem__(index))

    dataset = Decoded(remote=url, local=cache, shuffle=True, batch_size=BATCH)
    # The dataset fetched its index with each stream's S3 client, whose kept-alive connection
    # forked workers would share (two processes on one socket: mixed-up responses, corrupt
    # samples): drop the clients, so that each worker makes its own.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    return lambda: torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def imgpack_loader(url: str, endpoint: str, workers: int, cache: str) -> Callable[[], Any]:
    """imgpack's own read (the batch path, no cache) in a fresh process, timed as the peers are;
    each batch as a dict like theirs. Its exactly-once is the subject of imgpack's tests, so the
    images are counted as the distinct samples."""
    from readers import make_loader, open_iterable

    key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    options = {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": endpoint}}
    dataset = open_iterable(url, batch_size=BATCH, crop=CROP, seed=0, storage_options=options)

    def batches() -> Iterator[dict[str, Any]]:
        for _, y in make_loader(dataset, num_workers=workers):
            yield {"cls": y, "index": None}

    return batches


def read(peer: str, url: str, endpoint: str, workers: int) -> dict[str, Any]:
    """One epoch streamed into a fresh cache directory: images, distinct samples, seconds, and
    the first batch's images and seconds."""
    make = {"litdata": litdata_loader, "streaming": streaming_loader, "imgpack": imgpack_loader}[peer]
    with tempfile.TemporaryDirectory(prefix=f"{peer}-cache-") as cache:
        loader = make(url, endpoint, workers, cache)
        images, started = 0, time.perf_counter()
        seen: set[int] = set()
        first = (0, 0.0)
        for batch in loader():
            images += len(batch["cls"])
            index = batch["index"]
            seen.update(index.tolist() if index is not None else range(images - len(batch["cls"]), images))
            if first[0] == 0:
                first = (images, time.perf_counter() - started)
        seconds = time.perf_counter() - started
    return {
        "images": images,
        "distinct": len(seen),
        "seconds": seconds,
        "first_batch_images": first[0],
        "first_batch_s": first[1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("write", "read"))
    parser.add_argument("peer", choices=(*PEERS, "imgpack"))
    parser.add_argument("--pack", type=Path, help="write: the imgpack tar pack (a local directory)")
    parser.add_argument("--out", type=Path, help="write: the peer's output directory (made)")
    parser.add_argument("--url", help="read: s3://bucket/prefix of the peer's upload")
    parser.add_argument("--endpoint", help="read: the S3 endpoint URL")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.mode == "write":
        if args.pack is None or args.out is None:
            parser.error("write needs --pack and --out")
        (write_litdata if args.peer == "litdata" else write_streaming)(args.pack, args.out)
        return 0
    if args.url is None or args.endpoint is None:
        parser.error("read needs --url and --endpoint")
    print(json.dumps(read(args.peer, args.url, args.endpoint, args.workers)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
