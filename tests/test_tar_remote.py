"""Tar datasets behind s3:// URLs, against a real S3-compatible server (moto) started on localhost."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
from torch.utils.data import DataLoader

from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ManifestError
from readers.formats import open_reader

BUCKET = "imgpack-test"
SPLIT = {"samples_per_shard": 10}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 for this module; yields (s3fs filesystem, storage_options)."""
    from moto.server import ThreadedMotoServer

    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import s3fs

        # The region comes from AWS_DEFAULT_REGION: a us-east-1 bucket takes no LocationConstraint.
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(BUCKET)
        yield fs, options
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def remote(s3, packed):
    """sample_data packed as tar and uploaded; (local path, s3 URL, storage_options)."""
    fs, options = s3
    local = packed("tar", options=SPLIT, resize=32, crop=32)
    fs.put(str(local) + "/", f"{BUCKET}/ds", recursive=True)
    return local, f"s3://{BUCKET}/ds", options


def test_map_style_over_s3_matches_local(remote):
    local, url, options = remote
    ours = open_reader(local)
    theirs = open_reader(url, storage_options=options)
    assert theirs.remote and len(theirs) == len(ours) == 44
    assert [bytes(r.data) for r in theirs.read_block(0, 44)] == [
        bytes(r.data) for r in ours.read_block(0, 44)
    ]
    assert bytes(theirs.read(37).data) == bytes(ours.read(37).data)
    ds = open_dataset(url, decode="numpy", reader_options={"storage_options": options})
    image, label = ds[12]
    assert image.shape == (32, 32, 3) and label == ours.read(12).label


def test_iterable_over_s3_with_workers_and_cache(remote, tmp_path):
    local, url, options = remote
    cache = tmp_path / "cache"
    kwargs = dict(shuffle=True, seed=1, batch_size=8, block_size=10, buffer_size=20)
    it = open_iterable(url, **kwargs, reader_options={"storage_options": options, "cache_dir": str(cache)})
    got = [(x.numpy(), y.numpy()) for x, y in DataLoader(it, batch_size=None, num_workers=2)]
    want = [(x.numpy(), y.numpy()) for x, y in DataLoader(open_iterable(local, **kwargs), batch_size=None)]
    assert len(got) == len(want) == 6
    for (gx, gy), (wx, wy) in zip(got, want):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy)
    manifest = it.reader.manifest
    assert sorted(p.name for p in cache.glob("*.tar")) == sorted(f"{s.sha256}.tar" for s in manifest.shards)
    assert not list(cache.glob(".*.part"))


def test_uncached_streaming_reads_ranges(remote):
    local, url, options = remote
    it = open_iterable(url, shuffle=False, batch_size=16, reader_options={"storage_options": options})
    labels = np.concatenate([y.numpy() for _, y in DataLoader(it, batch_size=None, num_workers=2)])
    assert labels.tolist() == open_reader(local).labels().tolist()


def test_cache_is_size_bounded(remote, tmp_path):
    local, url, options = remote
    shards = open_reader(local).manifest.shards
    bound = shards[0].bytes + shards[1].bytes + 100
    reader = open_reader(url, storage_options=options, cache_dir=str(tmp_path), cache_size=bound)
    reader.read_block(0, 44)
    cached = list(tmp_path.glob("*.tar"))
    assert 1 <= len(cached) <= 2 and sum(p.stat().st_size for p in cached) <= bound
    assert reader.read(0).label == 0  # evicted shards stay readable through open handles


def test_corrupt_remote_shard_is_never_used(s3, remote, tmp_path):
    fs, _ = s3
    local, _, options = remote
    url = f"s3://{BUCKET}/corrupt"
    fs.put(str(local) + "/", f"{BUCKET}/corrupt", recursive=True)
    data = bytearray(fs.cat_file(f"{BUCKET}/corrupt/shard-000001.tar"))
    data[700] ^= 0xFF
    fs.pipe_file(f"{BUCKET}/corrupt/shard-000001.tar", bytes(data))
    reader = open_reader(url, storage_options=options, cache_dir=str(tmp_path))
    assert reader.read(0).label == 0
    with pytest.raises(ChecksumError, match="corrupt/shard-000001.tar: downloaded"):
        reader.read(10)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [f"{reader.manifest.shards[0].sha256}.tar"]
    with pytest.raises(ChecksumError, match="shard-000001.tar: shard bytes do not match"):
        open_reader(url, storage_options=options, verify=True).read(10)


def test_missing_remote_dataset_is_a_clear_error(remote):
    _, _, options = remote
    with pytest.raises(ManifestError, match=f"s3://{BUCKET}/nothing/manifest.json: not found"):
        open_reader(f"s3://{BUCKET}/nothing", storage_options=options)
