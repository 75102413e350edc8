"""Reading ahead from object storage (readers/remote/remote_ahead.py), against a real moto S3 server."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from packer.bench.delay_proxy import delayed
from readers import make_loader, mix, open_iterable
from readers.errors import OptionError
from readers.formats import format_names, open_reader
from readers.remote._range_plan import plan_requests, stretches
from readers.remote.remote_ahead import AheadSettings, ahead_settings, parse_size
from tests.support.s3server import BUCKET
from tests.support.worker_calls import CALLS_ENV, record_worker_calls, worker_calls

SPLIT = {"samples_per_shard": 10}
SMALL = {"resize": 32, "crop": 32}
READ = {"seed": 5, "block_size": 4, "buffer_size": 16, "crop": 32}


@pytest.fixture(scope="module")
def tar_remote(s3, packed):
    """sample_data packed as tar (10 samples a shard) and uploaded: (local path, URL, storage_options)."""
    fs, options = s3
    local = packed("tar", options=SPLIT, **SMALL)
    fs.put(str(local) + "/", f"{BUCKET}/ahead", recursive=True)
    return local, f"s3://{BUCKET}/ahead", options


def batches(it, workers=0, **loader):
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in make_loader(it, num_workers=workers, **loader)]


def same(got, want) -> bool:
    return len(got) == len(want) and all(
        np.array_equal(gx, wx) and np.array_equal(gy, wy) for (gx, gy), (wx, wy) in zip(got, want)
    )


# -- the plan --------------------------------------------------------------------------------
def test_plan_merges_near_ranges_of_one_stretch_and_covers_every_read():
    reads = [(0, 0, 100), (1, 0, 50), (0, 150, 300), (0, 5000, 5100), (0, 300, 400), (0, 400, 2000)]
    settings = AheadSettings(ahead_bytes=4 * 10_000, merge_gap=100, request_bytes=1000)
    requests, serving = plan_requests(reads, settings)
    for (shard, start, end), index in zip(reads, serving):
        request = requests[index]
        assert request.shard == shard and request.start <= start and end <= request.end
    spans = [(r.shard, r.start, r.end) for r in requests]
    # 0..400 merged (gaps <= 100); 400..2000 would pass request_bytes; shard 1 and 5000.. apart
    assert spans == [(0, 0, 400), (1, 0, 50), (0, 5000, 5100), (0, 400, 2000)]  # by first need
    assert [r.uses for r in requests] == [3, 1, 1, 1]
    tiny = AheadSettings(ahead_bytes=4 * 60, merge_gap=100, request_bytes=1000)  # stretches of 60-240 bytes
    requests, _ = plan_requests(reads, tiny)
    assert (0, 0, 100) in [(r.shard, r.start, r.end) for r in requests]  # not merged across stretches


def windowed_reads(windows: int, blocks: int, per_block: int, size: int, seed: int = 0) -> list:
    """Sample reads of a shuffled order: blocks permuted, each window of ``blocks`` blocks shuffled."""
    rng = np.random.default_rng(seed)
    permuted = rng.permutation(windows * blocks)
    order = []
    for w in range(windows):
        window = permuted[w * blocks : (w + 1) * blocks]
        order += rng.permutation(
            np.concatenate([np.arange(b * per_block, (b + 1) * per_block) for b in window])
        ).tolist()
    return [(0, i * size, (i + 1) * size) for i in order]


@pytest.mark.parametrize("windows_per_budget", [1.5, 2.0, 3.7])
def test_stretches_end_where_shuffle_windows_end_so_each_block_is_fetched_once(windows_per_budget):
    per_window = 8 * 64 * 1000  # 8 blocks of 64 samples of 1,000 bytes
    reads = windowed_reads(windows=9, blocks=8, per_block=64, size=1000)
    settings = AheadSettings(
        ahead_bytes=int(windows_per_budget * per_window), merge_gap=4000, request_bytes=64_000
    )
    cuts = stretches(reads, settings)
    assert [b for _, b in cuts[:-1]] and all(b % (8 * 64) == 0 for _, b in cuts[:-1])  # on window ends
    assert all(b - a <= settings.ahead_bytes // 1000 for a, b in cuts)
    requests, serving = plan_requests(reads, settings)
    assert sum(r.size for r in requests) == len(reads) * 1000  # every byte once
    assert all(requests[k].start <= s and e <= requests[k].end for k, (_, s, e) in zip(serving, reads))


def test_a_window_larger_than_the_budget_is_cut_inside_it_within_the_bounds():
    reads = windowed_reads(windows=2, blocks=8, per_block=64, size=1000)
    settings = AheadSettings(ahead_bytes=200_000, merge_gap=4000, request_bytes=64_000)
    cuts = stretches(reads, settings)
    assert len(cuts) > 4 and all(50 <= b - a <= 200 for a, b in cuts[:-1])  # a quarter to all of 200 kB
    requests, _ = plan_requests(reads, settings)
    held = sum(r.size for r in requests) / (len(reads) * 1000)
    assert 1 < held < 4  # inside a window each stretch fetches the blocks it reads from: more than once


def test_reads_passed_over_are_let_go_and_then_read_directly():
    from readers.remote.remote_ahead import RangeFetcher

    blob = bytes(range(256))
    asked: list[tuple[int, int]] = []

    def fetch(shard: int, start: int, end: int) -> bytes:
        asked.append((start, end))
        return blob[start:end]

    reads = [(0, 0, 10), (0, 10, 20), (0, 200, 210), (0, 12, 18)]
    settings = AheadSettings(ahead_bytes=4 * 10, requests=2, merge_gap=0, request_bytes=1000)
    fetcher = RangeFetcher(reads, fetch, settings)
    try:
        assert bytes(fetcher.take(0, 200, 210)) == blob[200:210]  # reads 0 and 1 passed over
        assert fetcher.take(0, 0, 10) is None  # asked for late: the caller reads it directly
        assert bytes(fetcher.take(0, 12, 18)) == blob[12:18]
        assert fetcher.take(0, 50, 60) is None  # never planned
        assert fetcher.held == 0 and all(r.uses == 0 for r in fetcher.requests)
    finally:
        fetcher.close()


# -- the knobs -------------------------------------------------------------------------------
def test_knobs_defaults_sizes_and_bad_values():
    assert ahead_settings({}) == AheadSettings(256 << 20, 8, 1 << 20, 8 << 20)
    got = ahead_settings({"IMGPACK_REMOTE_AHEAD_BYTES": "64M", "IMGPACK_REMOTE_REQUESTS": "0"})
    assert got.ahead_bytes == 64 << 20 and not got.enabled
    assert parse_size("512k") == 512 << 10 and parse_size("2GiB") == 2 << 30 and parse_size("77") == 77
    for name, raw in [
        ("IMGPACK_REMOTE_AHEAD_BYTES", "lots"),
        ("IMGPACK_REMOTE_REQUESTS", "-1"),
        ("IMGPACK_REMOTE_REQUEST_BYTES", "0"),
        ("IMGPACK_REMOTE_MERGE_GAP", "1.5M"),
    ]:
        with pytest.raises(OptionError, match=rf"{name}='{raw}': must be .*docs/object-storage.md"):
            ahead_settings({name: raw})


def test_bad_knob_is_a_clear_error_when_reading(tar_remote, monkeypatch):
    _, url, options = tar_remote
    monkeypatch.setenv("IMGPACK_REMOTE_REQUESTS", "many")
    it = open_iterable(url, batch_size=4, storage_options=options, **READ)
    with pytest.raises(OptionError, match="IMGPACK_REMOTE_REQUESTS='many'"):
        next(iter(it))


# -- same samples, same order ----------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("path", ["batch", "per-sample"])
def test_remote_tar_reads_what_local_reads(tar_remote, workers, path, monkeypatch):
    local, url, options = tar_remote
    monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "4k")  # several stretches, requests dropped
    monkeypatch.setenv("IMGPACK_REMOTE_REQUEST_BYTES", "2k")
    shape = {"batch_size": 4} if path == "batch" else {"decode": "tensor"}
    loader = {} if path == "batch" else {"batch_size": 4}
    want = batches(open_iterable(local, **shape, **READ), **loader)
    got = batches(open_iterable(url, storage_options=options, **shape, **READ), workers, **loader)
    assert len(want) == 11 and same(got, want)


def test_resume_mid_epoch_and_a_mix_with_a_local_dataset(tar_remote, packed):
    local, url, options = tar_remote
    other = packed("lmdb", **SMALL)
    kwargs = dict(weights=[1, 1], batch_size=4, **READ)
    want = batches(mix([local, other], **kwargs), 2)
    loader = make_loader(mix([url, other], storage_options=options, **kwargs), num_workers=2)
    taken = []
    for x, y in loader:
        taken.append((x.numpy().copy(), y.numpy().copy()))
        if len(taken) == 5:
            break
    state = loader.state_dict()
    resumed = make_loader(mix([url, other], storage_options=options, **kwargs), num_workers=2)
    resumed.load_state_dict(state)
    rest = [(x.numpy().copy(), y.numpy().copy()) for x, y in resumed]
    assert len(want) > 10 and same(taken, want[:5]) and same(rest, want[5:])


def upload(fs, local, name: str) -> str:
    fs.put(str(local) + "/", f"{BUCKET}/{name}", recursive=True)
    return f"s3://{BUCKET}/{name}"


def cached_files(reader, cache) -> list:
    """The files each part of ``reader`` leaves in the part cache: its copy and its sidecars'."""
    files = []
    for shard in reader.manifest.shards:
        files.append(cache / f"{shard.sha256}{Path(reader.checksum_name(shard)).suffix}")
        files += [cache / f"{shard.sha256}.idx" for _ in reader.sidecar_names(shard)]
    return files


@pytest.mark.parametrize("fmt", format_names())
def test_parts_through_the_cache_are_downloaded_ahead_with_their_indexes(s3, packed, tmp_path, fmt):
    fs, options = s3
    local = packed(fmt, options=SPLIT, **SMALL)
    url = upload(fs, local, f"ahead-{fmt}")
    it = open_iterable(url, batch_size=4, storage_options=options, cache_dir=tmp_path, **READ)
    stream = iter(it)
    first = next(stream)
    wanted, shards = cached_files(it.reader, tmp_path), it.reader.manifest.shards
    deadline = time.monotonic() + 30  # fetched while the first parts are read, not on each opening
    while not all(f.exists() for f in wanted) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(it.reader._handles) < len(shards) and all(f.exists() for f in wanted)
    got = [(first[0].numpy(), first[1].numpy())] + [(x.numpy(), y.numpy()) for x, y in stream]
    assert same(got, batches(open_iterable(local, batch_size=4, **READ)))


@pytest.mark.parametrize("fmt", format_names())
def test_the_cache_with_verify_workers_and_a_resume_reads_the_local_batches(s3, packed, tmp_path, fmt):
    fs, options = s3
    local = packed(fmt, options=SPLIT, **SMALL)
    url = upload(fs, local, f"verify-{fmt}")
    want = batches(open_iterable(local, batch_size=4, **READ))
    remote = dict(storage_options=options, cache_dir=tmp_path, verify=True, batch_size=4, **READ)
    loader = make_loader(open_iterable(url, **remote), num_workers=2)
    taken = []
    for x, y in loader:  # the workers download the parts ahead, each checked against the manifest
        taken.append((x.numpy().copy(), y.numpy().copy()))
        if len(taken) == 4:
            break
    resumed = make_loader(open_iterable(url, **remote), num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    rest = [(x.numpy().copy(), y.numpy().copy()) for x, y in resumed]
    assert len(want) == 11 and same(taken, want[:4]) and same(rest, want[4:])
    reader = open_reader(url, storage_options=options, cache_dir=tmp_path)
    assert all(f.exists() for f in cached_files(reader, tmp_path))  # each part and index once, shared


def test_parts_through_the_cache_download_several_at_once_within_the_limit(s3, packed, tmp_path, monkeypatch):
    fs, options = s3
    local = packed("lmdb", options=SPLIT, **SMALL)
    fs.put(str(local) + "/", f"{BUCKET}/parallel-lmdb", recursive=True)
    monkeypatch.setenv("IMGPACK_REMOTE_REQUESTS", "2")
    it = open_iterable(
        f"s3://{BUCKET}/parallel-lmdb", batch_size=4, storage_options=options, cache_dir=tmp_path, **READ
    )
    download, lock = it.reader.local_file, threading.Lock()
    helpers = {"now": 0, "most": 0}

    def slow_download(shard):  # a slow server: downloads overlap where several are in flight
        helper = threading.current_thread() is not threading.main_thread()
        with lock:
            helpers["now"] += helper
            helpers["most"] = max(helpers["most"], helpers["now"])
        try:
            time.sleep(0.3)
            return download(shard)
        finally:
            with lock:
                helpers["now"] -= helper

    it.reader.local_file = slow_download
    got = [(x.numpy(), y.numpy()) for x, y in it]
    assert len(it.reader.manifest.shards) >= 3 and helpers["most"] == 2, helpers
    assert same(got, batches(open_iterable(local, batch_size=4, **READ)))


# -- the bounds ------------------------------------------------------------------------------
def test_bytes_held_and_requests_in_flight_stay_bounded(tar_remote, monkeypatch):
    local, url, options = tar_remote
    monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "6k")
    monkeypatch.setenv("IMGPACK_REMOTE_REQUEST_BYTES", "2k")
    monkeypatch.setenv("IMGPACK_REMOTE_REQUESTS", "3")
    it = open_iterable(url, batch_size=4, storage_options=options, **READ)
    seen: list[tuple[int, int, int]] = []
    fetchers = []
    for _ in it:
        fetcher = it.reader.ahead
        fetchers.append(fetcher)
        seen.append((fetcher.held, fetcher.in_flight, max(r.size for r in fetcher.requests)))
    fetcher = fetchers[0]
    assert fetcher is not None and len({id(f) for f in fetchers}) == 1 and it.reader.ahead is None
    largest = max(r.size for r in fetcher.requests)
    assert fetcher.peak <= 6 * 1024 + largest and all(held <= 6 * 1024 + largest for held, _, _ in seen)
    assert all(in_flight <= 3 for _, in_flight, _ in seen)
    assert len(fetcher.requests) > 3 and fetcher.fetched_bytes <= fetcher.planned_bytes
    assert fetcher.held == 0  # every buffer dropped once read
    for name in ("IMGPACK_REMOTE_AHEAD_BYTES", "IMGPACK_REMOTE_REQUEST_BYTES"):
        monkeypatch.delenv(name)
    for _ in it:
        fetcher = it.reader.ahead
    total = sum(shard.bytes for shard in it.reader.manifest.shards)
    assert fetcher.fetched_bytes <= total < fetcher.planned_bytes  # one stretch: overlaps fetched once


def test_latency_server_is_read_with_requests_in_flight(tar_remote, monkeypatch):
    local, url, options = tar_remote
    endpoint = options["client_kwargs"]["endpoint_url"]
    want = batches(open_iterable(local, batch_size=4, **READ))
    timings = {}
    with delayed(endpoint, 0.05) as proxy:
        slow = {"client_kwargs": {"endpoint_url": proxy.endpoint}}
        for requests in ("0", "8"):
            monkeypatch.setenv("IMGPACK_REMOTE_REQUESTS", requests)
            it = open_iterable(url, batch_size=4, storage_options=slow, **READ)
            before, started = proxy.requests, time.monotonic()
            assert same(batches(it), want)
            timings[requests] = (time.monotonic() - started, proxy.requests - before)
    (off, off_requests), (on, on_requests) = timings["0"], timings["8"]
    assert on_requests < off_requests  # merged ranges: fewer, larger requests
    assert off_requests > 20 and off > off_requests * 0.05  # one request at a time, each delayed
    assert on < off / 2, timings


BOUND = 8  # seconds ($IMGPACK_REMOTE_TIMEOUT): a loaded machine's moto may take 3 s for a request


@pytest.mark.parametrize("workers", [0, 2])
def test_stalled_server_is_a_remote_error_within_the_bound(packed, monkeypatch, workers):
    from readers.remote.urls import RemoteError
    from tests.support.s3server import moto_s3_process, stopped

    with moto_s3_process() as (fs, options, proc):
        fs.put(str(packed("tar", options=SPLIT, **SMALL)), f"{BUCKET}/ds", recursive=True)
        monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", str(BOUND))
        monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "2k")  # later reads still need the server
        monkeypatch.setenv("IMGPACK_REMOTE_REQUEST_BYTES", "1k")
        it = open_iterable(f"s3://{BUCKET}/ds", batch_size=4, storage_options=options, **READ)
        stream = iter(make_loader(it, num_workers=workers))
        next(stream)
        with stopped(proc):
            started = time.monotonic()
            # the call's bound, or under load the request timeouts inside it (a quarter of the bound)
            stalled = rf"s3://{BUCKET}/ds/shard-.*(no answer from the server for 8 s|within the timeouts)"
            with pytest.raises(RemoteError, match=stalled):
                for _ in stream:
                    pass
            waited = time.monotonic() - started
        monkeypatch.delenv("IMGPACK_REMOTE_TIMEOUT")
    assert waited < 4 * BOUND, waited


def test_a_whole_part_is_one_request_and_an_empty_one_still_reads(tar_remote, s3):
    from readers.remote.remote_parts import RemoteParts

    _, url, options = tar_remote
    fs, _ = s3
    fs.pipe(f"{BUCKET}/ahead/empty.bin", b"")
    with delayed(options["client_kwargs"]["endpoint_url"], 0) as proxy:
        parts = RemoteParts(url, {"client_kwargs": {"endpoint_url": proxy.endpoint}})
        parts.read("shard-000000.idx")  # the client's first request
        before = proxy.requests
        text = parts.read("shard-000001.idx")
        assert proxy.requests - before == 1 and text == fs.cat_file(f"{BUCKET}/ahead/shard-000001.idx")
        assert parts.read("empty.bin") == b""  # no byte 0 to ask for: read the plain way


def test_the_planned_reads_are_the_reads_read_many_makes(packed):
    """The plan (arrays, for a rank of 10^5+ reads) names each read as read_many makes it: blocks
    of the merge gap with the records between, cut at shard ends, in each group's order."""
    from readers.formats import open_reader
    from readers.remote._range_plan import read_ranges

    reader = open_reader(packed("tar", options=SPLIT, **SMALL))
    rng = np.random.default_rng(1)
    groups = [rng.choice(len(reader), size=int(rng.integers(1, 12)), replace=True) for _ in range(40)]
    groups.append(np.array([8, 9, 10, 11, 12]))  # a block across a shard's end (10 a shard)
    made = []
    real = reader.read_local

    def recording(position, a, b):
        made.append((position, *reader.byte_range(reader.handle(position), a, b)))
        return real(position, a, b)

    reader.read_local = recording
    try:
        for group in groups:
            reader.read_many(group)
        table, group_of = read_ranges(reader, groups)
    finally:
        reader.close()
    assert [tuple(row) for row in table.tolist()] == made
    assert np.array_equal(np.diff(group_of) >= 0, np.ones(len(group_of) - 1, dtype=bool))


# BMP's images are fetched one request each, cached index or not: its workers need a session.
@pytest.mark.parametrize("fmt", [f for f in format_names() if f != "bmp"])
def test_workers_that_find_every_part_cached_make_no_session(s3, packed, tmp_path, monkeypatch, fmt):
    """Through a cache_dir that holds every part (a second epoch), a worker opens the cached
    copies without an S3 session of its own (one costs 40-160 ms of a worker's start)."""
    fs, options = s3
    local = packed(fmt, options=SPLIT, **SMALL)
    url = upload(fs, local, f"cached-{fmt}")
    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    want = batches(open_iterable(local, batch_size=4, **READ))
    remote = dict(storage_options=options, cache_dir=tmp_path / "cache", batch_size=4, **READ)
    sessions = []
    for _ in range(2):
        calls.unlink(missing_ok=True)
        loader = make_loader(open_iterable(url, **remote), num_workers=2, worker_init_fn=record_worker_calls)
        assert same([(x.numpy().copy(), y.numpy().copy()) for x, y in loader], want)
        sessions.append(worker_calls(calls).count("session"))
    assert sessions[0] >= 1 and sessions[1] == 0, sessions  # the first epoch's workers downloaded
