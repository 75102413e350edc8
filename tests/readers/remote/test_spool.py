"""The spool a rank's DataLoader workers share (readers/remote/_spool.py): each remote byte range
fetched once per rank, against a real moto S3 server and real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from packer.bench.delay_proxy import delayed
from readers import make_loader, mix, open_iterable
from readers.remote._spool import PREFIX, Spool, spool_root, sweep
from readers.remote.urls import RemoteError
from tests.support.disks import mounted_tmpfs
from tests.support.s3server import BUCKET
from tests.support.worker_calls import CALLS_ENV, record_worker_calls, worker_calls

SPLIT = {"samples_per_shard": 10}
SMALL = {"resize": 32, "crop": 32}
READ = {"seed": 5, "block_size": 4, "buffer_size": 16, "crop": 32}


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def two_workers(root, needers=(2,), members=2):
    """Two workers' views of one spool (as two processes would open it)."""
    needs = np.array(needers)
    first = Spool.open(root, 1, "tag-ds", "plan", needs, members)
    second = Spool.open(root, 1, "tag-ds", "plan", needs, members)
    assert first is not None and second is not None and first.path == second.path
    return first, second


# -- one worker fetches, the others map -----------------------------------------------------
def test_the_first_claim_fetches_and_the_other_worker_maps_it(tmp_path):
    a, b = two_workers(tmp_path)
    calls = []

    def fetch():
        calls.append(1)
        return b"0123456789"

    got_a = a.obtain(0, fetch, 5, "s3://b/x.tar")
    got_b = b.obtain(0, lambda: pytest.fail("fetched twice"), 5, "s3://b/x.tar")
    assert bytes(got_a) == bytes(got_b) == b"0123456789" and calls == [1]
    assert a.published_bytes == 10 and b.mapped_bytes == 10
    a.done_with(0)
    assert (a.path / "0").exists()  # one of its two readers is still to come
    b.done_with(0)
    assert not (a.path / "0").exists() and not (a.path / "0.claim").exists()
    assert bytes(got_b[2:5]) == b"234"  # a mapping outlives the name
    a.close([0])
    assert a.path.exists()
    b.close([0])
    assert not a.path.exists()  # the last worker out removes the directory


def test_a_worker_waits_for_a_range_another_is_fetching(tmp_path):
    a, b = two_workers(tmp_path)
    release = threading.Event()
    result = {}

    def slow():
        release.wait(10)
        return b"late bytes"

    fetching = threading.Thread(target=lambda: result.setdefault("a", a.obtain(0, slow, 5, "u")))
    fetching.start()
    while not (a.path / "0.claim").exists():
        time.sleep(0.001)
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    got = b.obtain(0, lambda: pytest.fail("fetched twice"), 5, "u")
    fetching.join()
    assert bytes(got) == b"late bytes" and time.monotonic() - started >= 0.15


def test_a_claim_whose_owner_died_is_taken_over(tmp_path):
    a, _ = two_workers(tmp_path)
    (a.path / "0.claim").write_text(str(dead_pid()))
    assert bytes(a.obtain(0, lambda: b"fresh", 5, "u")) == b"fresh"


def test_a_fetch_error_reaches_the_waiting_worker_at_once(tmp_path):
    a, b = two_workers(tmp_path)

    def broken():
        raise RemoteError("s3://bucket/ds/shard-0.tar: no answer from the server for 8 s")

    with pytest.raises(RemoteError, match="no answer"):
        a.obtain(0, broken, 30, "u")
    started = time.monotonic()
    with pytest.raises(RemoteError, match="shard-0.tar: no answer from the server for 8 s"):
        b.obtain(0, lambda: pytest.fail("fetched again"), 30, "u")
    assert time.monotonic() - started < 5


def test_waiting_on_a_live_claim_is_bounded(tmp_path):
    a, _ = two_workers(tmp_path)
    (a.path / "0.claim").write_text(str(os.getpid()))  # claimed by a live process that never publishes
    started = time.monotonic()
    with pytest.raises(
        RemoteError, match=r"s3://b/x.tar: reading ahead: no answer from the server for 0.5 s"
    ):
        a.obtain(0, lambda: pytest.fail("the claim is alive"), 0.5, "s3://b/x.tar")
    assert 0.4 < time.monotonic() - started < 5


def test_a_swept_directory_is_made_again_under_an_idle_pass(tmp_path):
    a, b = two_workers(tmp_path)
    for f in a.path.iterdir():
        f.unlink()
    a.path.rmdir()
    assert bytes(a.obtain(0, lambda: b"again", 5, "u")) == b"again"
    assert bytes(b.obtain(0, lambda: pytest.fail("fetched twice"), 5, "u")) == b"again"


@pytest.mark.root
def test_a_full_spool_leaves_the_bytes_with_their_fetcher(tmp_path):
    with mounted_tmpfs(tmp_path / "shm", "64k") as shm:
        a, b = two_workers(shm)
        big = os.urandom(200_000)
        assert bytes(a.obtain(0, lambda: big, 5, "u")) == big  # could not publish: kept in memory
        assert not list(a.path.glob("0.tmp-*")) and not (a.path / "0").exists()
        assert bytes(b.obtain(0, lambda: big[::-1], 5, "u")) == big[::-1]  # fetched by the other itself


def test_sweep_removes_what_dead_owners_and_earlier_passes_left(tmp_path):
    gone = tmp_path / f"{PREFIX}{dead_pid()}-t1-ds-p1"
    earlier = tmp_path / f"{PREFIX}{os.getpid()}-t1-ds-p0"
    other_stream = tmp_path / f"{PREFIX}{os.getpid()}-t2-ds-p0"
    current = tmp_path / f"{PREFIX}{os.getpid()}-t1-ds-p1"
    for d in (gone, earlier, other_stream, current):
        d.mkdir()
        (d / "0").write_bytes(b"x")
    sweep(tmp_path, os.getpid(), "t1-ds", current.name)
    assert not gone.exists() and not earlier.exists() and other_stream.exists() and current.exists()


def test_the_spool_goes_to_dev_shm_where_it_has_room_else_the_temporary_directory(tmp_path):
    import tempfile

    assert spool_root(1 << 20, {}) == Path("/dev/shm")
    assert spool_root(1 << 60, {}) == Path(tempfile.gettempdir())  # a container's 64 MB /dev/shm, say
    assert spool_root(1 << 20, {"IMGPACK_REMOTE_SPOOL": str(tmp_path)}) == tmp_path
    assert spool_root(1 << 20, {"IMGPACK_REMOTE_SPOOL": "off"}) is None


@pytest.mark.root
def test_another_users_directory_is_not_shared(tmp_path):
    root = tmp_path / "spools"
    root.mkdir()
    (root / f"{PREFIX}1-tag-ds-plan").mkdir()
    os.chown(root / f"{PREFIX}1-tag-ds-plan", 12345, 12345)
    assert Spool.open(root, 1, "tag-ds", "plan", np.array([2]), 2) is None


# -- a rank's workers against a real server -------------------------------------------------
@pytest.fixture(scope="module")
def tar_remote(s3, packed):
    fs, options = s3
    local = packed("tar", options=SPLIT, **SMALL)
    fs.put(str(local) + "/", f"{BUCKET}/spool", recursive=True)
    return local, f"s3://{BUCKET}/spool", options


def batches(loader):
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]


def same(got, want) -> bool:
    return len(got) == len(want) and all(
        np.array_equal(gx, wx) and np.array_equal(gy, wy) for (gx, gy), (wx, wy) in zip(got, want)
    )


def counted(options, proxy):
    return {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}


def test_two_workers_fetch_each_byte_once_and_read_what_local_reads(tar_remote, tmp_path, monkeypatch):
    local, url, options = tar_remote
    want = batches(make_loader(open_iterable(local, batch_size=4, **READ)))
    shard_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))
    served = {}
    with delayed(options["client_kwargs"]["endpoint_url"], 0) as proxy:
        for spool in (str(tmp_path), "off"):
            monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", spool)
            before = proxy.served_bytes
            it = open_iterable(url, batch_size=4, storage_options=counted(options, proxy), **READ)
            assert same(batches(make_loader(it, num_workers=2)), want)
            served[spool] = (proxy.served_bytes - before) / shard_bytes
    # headers, manifest and indexes come on top of the shards' bytes; two workers without
    # sharing fetch the blocks they read from whole, each
    assert served[str(tmp_path)] < 1.3 < 1.7 < served["off"], served
    assert not list(tmp_path.iterdir())  # the last worker out removed the spool


@pytest.mark.parametrize("path", ["batch", "per-sample"])
def test_persistent_workers_resume_and_epochs_with_a_spool(tar_remote, tmp_path, monkeypatch, path):
    """Persistent workers over two epochs, a mid-epoch resume (each worker resumes with progress of
    its own: it fetches for itself) into the next epoch (shared again), the same as a local read."""
    local, url, options = tar_remote
    monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", str(tmp_path))
    monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "4k")  # several stretches, requests dropped
    monkeypatch.setenv("IMGPACK_REMOTE_REQUEST_BYTES", "2k")
    shape = {"batch_size": 4} if path == "batch" else {"decode": "tensor"}
    loader_args = {"persistent_workers": True} | ({} if path == "batch" else {"batch_size": 4})
    want_it = open_iterable(local, **shape, **READ)
    want = [batches(make_loader(want_it, **({} if path == "batch" else {"batch_size": 4}))) for _ in range(2)]
    loader = make_loader(
        open_iterable(url, storage_options=options, **shape, **READ), num_workers=2, **loader_args
    )
    taken = []
    for batch in loader:
        taken.append((batch[0].numpy().copy(), batch[1].numpy().copy()))
        if len(taken) == 5:
            break
    state = loader.state_dict()
    assert same(taken, want[0][:5])
    resumed = make_loader(
        open_iterable(url, storage_options=options, **shape, **READ), num_workers=2, **loader_args
    )
    resumed.load_state_dict(state)
    assert same(batches(resumed), want[0][5:])
    assert same(batches(resumed), want[1])
    del loader, resumed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]


def test_a_mix_of_two_remote_datasets_and_a_view_share_spools(tar_remote, s3, packed, tmp_path, monkeypatch):
    from packer.edit.views import write_view

    local, url, options = tar_remote
    fs, _ = s3
    other = packed("tar", options={"samples_per_shard": 7}, **SMALL)
    fs.put(str(other) + "/", f"{BUCKET}/spool-other", recursive=True)
    picks = list(range(0, 40, 3))
    write_view(local, tmp_path / "view", picks)
    write_view(url, f"s3://{BUCKET}/spool-view", picks, storage_options=options)
    spools = tmp_path / "spools"
    spools.mkdir()
    monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", str(spools))
    kwargs = dict(weights=[2, 1], batch_size=4, **READ)
    want = batches(make_loader(mix([local, other], **kwargs)))
    remote = mix([url, f"s3://{BUCKET}/spool-other"], storage_options=options, **kwargs)
    assert same(batches(make_loader(remote, num_workers=2)), want)
    want = batches(make_loader(open_iterable(tmp_path / "view", batch_size=4, **READ)))
    view = open_iterable(f"s3://{BUCKET}/spool-view", storage_options=options, batch_size=4, **READ)
    assert same(batches(make_loader(view, num_workers=2)), want)
    assert not list(spools.iterdir())


def test_a_forked_worker_never_finalizes_its_parents_filesystems(tar_remote):
    """A worker forked from a process that read the dataset holds its parent's filesystem objects,
    whose connections belong to an event loop in a thread of the parent. Finalized in the worker
    (fsspec drops its cache there, the reader drops its handle), s3fs closed them on the worker's
    own loop: with kept-alive connections (s3rver's, AWS's), every worker printed "Task exception
    was never retrieved ... attached to a different loop". The worker now holds them instead."""
    import gc
    import weakref

    from readers.remote.remote_parts import RemoteParts
    from readers.remote.urls import url_fs

    _, url, options = tar_remote
    cached = url_fs(url, options)[0]  # fsspec's cached instance, with a session
    cached.cat_file(cached._strip_protocol(url) + "/manifest.json")
    parts = RemoteParts(url, options)
    own = parts.fs[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        alive = "no"
        try:
            watch = [weakref.ref(cached), weakref.ref(own)]
            del cached, own  # only fsspec's cache and the reader hold them now
            _ = parts.fs  # the reader's first use here drops the parent's handle
            url_fs(url, {**options, "default_block_size": 1 << 20})  # fsspec clears its cache here
            gc.collect()
            alive = "yes" if all(ref() is not None for ref in watch) else "no"
        finally:
            os.write(write, alive.encode())
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 8) == b"yes"


# -- the main process starts the first requests (readers/remote/prime.py) ---------------------
@pytest.fixture
def primes(monkeypatch):
    """The requests the main process fetched and published for its workers."""
    from readers.remote._spool import Spool

    done: list[int] = []
    prefetch = Spool.prefetch

    def counting(self, index, fetch):
        fetched = prefetch(self, index, fetch)
        if fetched:
            done.append(index)
        return fetched

    monkeypatch.setattr(Spool, "prefetch", counting)
    return done


@pytest.mark.parametrize("resume", [False, True], ids=["whole", "elastic-resume"])
def test_the_main_process_fetches_the_first_requests_and_its_workers_read_no_index(
    tar_remote, tmp_path, monkeypatch, primes, resume
):
    """The workers find the shards' indexes read by their main process before it forked them, and
    the requests it fetched in their spool: the batches are the local ones, every byte comes once
    per rank, and the spool the main process filled is the one its workers use and remove (a plan
    of its own would stay behind). Elastic: a state saved without workers read on by 2, which the
    main process plans from the state's position."""
    local, url, options = tar_remote
    spools, calls = tmp_path / "spools", tmp_path / "calls"
    spools.mkdir()
    monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", str(spools))
    monkeypatch.setenv(CALLS_ENV, str(calls))
    want = batches(make_loader(open_iterable(local, batch_size=4, **READ)))
    shard_bytes = sum(p.stat().st_size for p in local.glob("*.tar"))
    with delayed(options["client_kwargs"]["endpoint_url"], 0) as proxy:
        it = open_iterable(url, batch_size=4, storage_options=counted(options, proxy), **READ)
        if resume:  # saved without workers: read on by 2 from the position alone
            first = make_loader(it)
            taken = []
            for x, y in first:
                taken.append((x.numpy().copy(), y.numpy().copy()))
                if len(taken) == 3:
                    break
            assert same(taken, want[:3])
            state = first.state_dict()
            del first
            want = want[3:]
            it = open_iterable(url, batch_size=4, storage_options=counted(options, proxy), **READ)
            primes.clear()
        before = proxy.served_bytes
        loader = make_loader(it, num_workers=2, worker_init_fn=record_worker_calls)
        if resume:
            loader.load_state_dict(state)
        assert same(batches(loader), want)
        served = (proxy.served_bytes - before) / shard_bytes
    assert primes, "the main process fetched nothing ahead of its workers"
    assert "index" not in worker_calls(calls)
    assert served < 1.3, served
    assert not list(spools.iterdir())


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_not_forked_read_the_local_batches(tar_remote, tmp_path, monkeypatch, primes, context):
    """Spawned workers inherit no index but share the spool their main process fills. A forkserver's
    workers name another process as their owner: the main process fetches nothing for them."""
    local, url, options = tar_remote
    monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", str(tmp_path))
    want = batches(make_loader(open_iterable(local, batch_size=4, **READ)))
    it = open_iterable(url, batch_size=4, storage_options=options, **READ)
    assert same(batches(make_loader(it, num_workers=2, multiprocessing_context=context)), want)
    assert bool(primes) == (context == "spawn")
    assert not list(tmp_path.iterdir())


def test_the_main_process_fetches_only_what_the_workers_first_batches_wait_for():
    from readers.remote.prime import first_batches, first_within
    from readers.remote.remote_ahead import RankPlan

    # groups in the rank's order: worker 0, worker 1, worker 0, worker 1; the reads of each group
    # and the request serving each read
    rank = RankPlan([np.arange(2)] * 4, np.array([0, 1, 0, 1]), me=0, owner=1, num_workers=2)
    group = np.array([0, 0, 1, 1, 2, 3, 3])
    serving = np.array([0, 2, 1, 3, 4, 5, 6])
    assert first_batches(rank, group, serving) == 4  # requests 0-3: groups 0 and 1
    assert first_within([3, 3, 3], 7) == 2 and first_within([9, 1], 4) == 1 and first_within([], 4) == 0


def _gloo_rank(rank: int, local: str, url: str, options: dict, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        want = batches(make_loader(open_iterable(local, batch_size=4, **READ)))  # this rank's share
        prefetch, primed = Spool.prefetch, []
        Spool.prefetch = lambda self, index, fetch: primed.append(prefetch(self, index, fetch)) or primed[-1]
        it = open_iterable(url, batch_size=4, storage_options=options, **READ)
        got = batches(make_loader(it, num_workers=2))
        Path(out, f"rank{rank}").write_text(f"{same(got, want)} {len(got)} {sum(primed)}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_each_prime_their_own_workers(tar_remote, tmp_path, monkeypatch):
    """DDP: each rank's main process fills the spool of its own workers (named after it), and
    each rank reads what it reads locally; no spool is left behind."""
    import torch.multiprocessing as mp

    local, url, options = tar_remote
    spools = tmp_path / "spools"
    spools.mkdir()
    monkeypatch.setenv("IMGPACK_REMOTE_SPOOL", str(spools))
    args = (str(local), url, options, str(tmp_path / "store"), str(tmp_path))
    mp.spawn(_gloo_rank, args=args, nprocs=2, join=True)
    results = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    assert all(ok == "True" and int(n) > 0 and int(primed) > 0 for ok, n, primed in results), results
    assert not list(spools.iterdir())
