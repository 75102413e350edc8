"""Tar datasets behind s3:// URLs, against a real S3-compatible server (moto) started on localhost."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader

from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ManifestError
from readers.formats import open_reader
from readers.remote.urls import RemoteError, bounded_options
from readers.store.checksums import file_sha256
from tests.support.s3server import BUCKET

SPLIT = {"samples_per_shard": 10}


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
    assert reader.read(0).label == open_reader(local).read(0).label  # evicted shards: open handles


def test_corrupt_remote_shard_is_never_used(s3, remote, tmp_path):
    fs, _ = s3
    local, _, options = remote
    url = f"s3://{BUCKET}/corrupt"
    fs.put(str(local) + "/", f"{BUCKET}/corrupt", recursive=True)
    data = bytearray(fs.cat_file(f"{BUCKET}/corrupt/shard-000001.tar"))
    data[700] ^= 0xFF
    fs.pipe_file(f"{BUCKET}/corrupt/shard-000001.tar", bytes(data))
    reader = open_reader(url, storage_options=options, cache_dir=str(tmp_path))
    assert reader.read(0).label == open_reader(local).read(0).label
    with pytest.raises(ChecksumError, match="corrupt/shard-000001.tar: sha256 does not match the manifest"):
        reader.read(10)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [f"{reader.manifest.shards[0].sha256}.tar"]
    with pytest.raises(ChecksumError, match="shard-000001.tar: sha256 does not match the manifest"):
        open_reader(url, storage_options=options, verify=True).read(10)


def test_missing_remote_dataset_is_a_clear_error(remote):
    _, _, options = remote
    with pytest.raises(ManifestError, match=f"s3://{BUCKET}/nothing/manifest.json: not found"):
        open_reader(f"s3://{BUCKET}/nothing", storage_options=options)


@pytest.fixture
def stalled_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_stalled_server_fails_within_a_bounded_time(stalled_server):
    options = {
        "anon": True,
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{stalled_server}"},
        "config_kwargs": {"connect_timeout": 1, "read_timeout": 1},  # retries: imgpack's defaults
    }
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://stalled/ds/manifest.json: reading failed .*timeouts"):
        open_reader("s3://stalled/ds", storage_options=options)
    assert time.monotonic() - started < 30
    defaults = bounded_options("s3://stalled/ds", {"config_kwargs": {"read_timeout": 5}})
    assert defaults["config_kwargs"]["read_timeout"] == 5  # the user's value wins
    assert defaults["config_kwargs"]["connect_timeout"] == 10
    assert defaults["config_kwargs"]["retries"]["max_attempts"] == 2


def test_fully_cached_dataset_makes_no_shard_or_index_request(s3, remote, tmp_path):
    fs, _ = s3
    local, _, options = remote
    url = f"s3://{BUCKET}/cached"
    fs.put(str(local) + "/", f"{BUCKET}/cached", recursive=True)
    cache = tmp_path / "cache"
    first = open_reader(url, storage_options=options, cache_dir=str(cache))
    want = [bytes(r.data) for r in first.read_block(0, 44)]
    assert len(list(cache.glob("*.idx"))) == len(first.manifest.shards)
    for path in fs.ls(f"{BUCKET}/cached"):
        if not path.endswith("manifest.json"):
            fs.rm(path)  # only the manifest is left remotely
    second = open_reader(url, storage_options=options, cache_dir=str(cache))
    assert [bytes(r.data) for r in second.read_block(0, 44)] == want
    assert not list(cache.glob("*.lock")) and not list(cache.glob(".*.part"))


def test_corrupt_cached_shard_is_downloaded_again_under_verify(remote, tmp_path):
    local, url, options = remote
    reader = open_reader(url, storage_options=options, cache_dir=str(tmp_path))
    want = bytes(reader.read(12).data)
    cached = tmp_path / f"{reader.manifest.shards[1].sha256}.tar"
    blob = bytearray(cached.read_bytes())
    blob[700] ^= 0xFF
    with open(cached, "r+b") as fh:
        fh.write(blob)
    checked = open_reader(url, storage_options=options, cache_dir=str(tmp_path), verify=True)
    assert bytes(checked.read(12).data) == want
    assert file_sha256(cached) == reader.manifest.shards[1].sha256  # replaced by a fresh download


def test_leftover_part_and_lock_files_are_cleaned(remote, tmp_path):
    local, url, options = remote
    dead = tmp_path / f".{'a' * 64}.tar.{2**22 + 12345}.140.part"  # .<name>.<pid>.<thread>.part
    live = tmp_path / f".{'b' * 64}.tar.{os.getpid()}.140.part"
    unheld = tmp_path / f"{'c' * 64}.lock"
    for path in (dead, live, unheld):
        path.write_bytes(b"x")
    reader = open_reader(url, storage_options=options, cache_dir=str(tmp_path))
    assert reader.read(0).label == open_reader(local).read(0).label
    assert not dead.exists() and not unheld.exists()
    assert live.exists()  # a download in progress in a live process is left alone
    assert not list(tmp_path.glob("*.lock"))


@pytest.mark.parametrize("device", ["cpu", "dataloader"])
def test_dali_loader_over_s3_through_the_shard_cache(remote, tmp_path, device):
    from readers.dali import dali_loader

    local, url, options = remote
    cache = tmp_path / "cache"
    kwargs = dict(seed=4, block_size=10, crop=24, device=device, num_workers=2)
    got = dali_loader(
        url,
        batch_size=8,
        reader_options={"storage_options": options, "cache_dir": str(cache)},
        verify=True,
        **kwargs,
    )
    want = [(x.numpy(), y.numpy()) for x, y in dali_loader(local, batch_size=8, **kwargs)]
    batches = [(x.numpy(), y.numpy()) for x, y in got]
    assert len(batches) == len(want) == 6
    for (gx, gy), (wx, wy) in zip(batches, want):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy)
    manifest = got.reader.manifest
    assert sorted(p.name for p in cache.glob("*.tar")) == sorted(f"{s.sha256}.tar" for s in manifest.shards)
