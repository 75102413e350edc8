"""Issue 30 part 1: reading ahead of the order (readers/remote/readahead.py) with the page cache dropped.

Every registered format: a read whose files were evicted from the page cache (checked with
``mincore``) gives the same
samples in the same order as a warm read (0 and 2 workers, across a resume), the hints bring the
next groups' pages in, the budget holds, ``readahead=0`` hints nothing; LMDB's page table matches
what py-lmdb reads, and a damaged data.mdb is an error or no hints, never a crash.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import time

import lmdb
import numpy as np
import pytest
from PIL import Image

from packer.bench.pagecache import dataset_resident, evict, resident
from readers import make_loader, open_iterable
from readers.errors import OptionError
from readers.formats.lmdb._pages import PageTable, PageTableError
from readers.formats.registry import format_names
from readers.remote import readahead
from readers.remote.readahead import PIECE, Extent, ReadAhead, resolve_budget

# Blocks of 16 and a buffer of one block: batch k is block k of the order, so the batches after
# the first two lie in blocks nothing has read yet.
READ = {"batch_size": 16, "block_size": 16, "buffer_size": 16, "seed": 3}


@pytest.fixture(scope="module")
def noise_folder(tmp_path_factory):
    """480 noise JPEGs (64 px, ~10 KB each: JPEG cannot shrink noise), so a pack spans many pages."""
    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir()
        for i in range(160):
            pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i:03d}.jpg", quality=90)
    return root


@pytest.fixture(params=format_names())
def noise_pack(request, packed, noise_folder):
    return packed(request.param, src=noise_folder)


def uncache(path) -> None:
    """Drop the pack from the page cache, after closing the LMDB maps this process holds (pages
    a live process has mapped are not dropped: the reason each bench epoch is a fresh process)."""
    import gc

    from readers.formats.lmdb import reader as lmdb_reader

    gc.collect()  # readers of earlier reads close their transactions
    for env in lmdb_reader._ENVS.values():
        env.close()
    lmdb_reader._ENVS.clear()
    evict(path)


def batches(path, workers: int, skip: int = 0, state=None, **options):
    it = open_iterable(path, **READ, **options)
    loader = make_loader(it, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    out, saved = [], None
    for k, (images, labels) in enumerate(loader):
        out.append((images.clone(), labels.clone()))
        if k + 1 == skip:
            saved = loader.state_dict()
    return out, saved


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x[0].numpy(), y[0].numpy()) and np.array_equal(x[1].numpy(), y[1].numpy())
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_read_with_the_cache_dropped_gives_the_warm_samples_in_order(noise_pack, workers):
    warm, state = batches(noise_pack, workers, skip=5, readahead=0)
    uncache(noise_pack)
    assert dataset_resident(noise_pack) <= 0.01  # the pack really left the cache
    cold, _ = batches(noise_pack, workers)
    assert len(warm) == 30 and same(cold, warm)
    assert dataset_resident(noise_pack) > 0.9  # and this read brought it back
    uncache(noise_pack)
    resumed, _ = batches(noise_pack, workers, state=state)
    assert same(resumed, warm[5:])


def hinted_share(path, budget: int, settle: float = 0.0) -> float:
    """Read two batches of a pack dropped from the cache; the share of the next four batches'
    pages that is in the cache then, or within ``settle`` seconds: a hint starts reads the disk
    finishes later, and ``mincore`` counts a page only once its read is done (a busy CI disk once
    left one page of 256 in flight)."""
    uncache(path)
    it = open_iterable(path, **READ, readahead=budget)
    stream = iter(it)
    next(stream)
    next(stream)  # the hints before batch 1 are made once batch 0 has opened the parts
    it.hints.wait()
    later = it.order.epoch_order(it.epoch)[32:96]
    ranges, opened = [], []
    for e in it.reader.extents(later):
        if callable(e.file):  # a file per image: opened as a read opens it
            opened.append(e.file())
            ranges.append((opened[-1], 0, 0))
        else:
            offsets, lengths = np.atleast_1d(e.offset).tolist(), np.atleast_1d(e.length).tolist()
            ranges += [(e.file, o, n) for o, n in zip(offsets, lengths) if n > 0]
    deadline = time.monotonic() + settle
    while (share := resident(ranges)) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    for fd in opened:
        os.close(fd)
    return share


def test_the_hints_bring_the_next_batches_pages_in(noise_pack):
    assert hinted_share(noise_pack, resolve_budget(None), settle=5.0) == 1.0
    assert hinted_share(noise_pack, 0) < 0.9  # without hints those pages are still on the disk


def test_readahead_0_hints_nothing(noise_pack, monkeypatch):
    calls = []
    real = readahead.advise
    monkeypatch.setattr(readahead, "advise", lambda *a: (calls.append(a), real(*a)))
    for options in ({"readahead": 0}, {}):
        if not options:
            monkeypatch.setenv("IMGPACK_READAHEAD_BYTES", "0")
        it = open_iterable(noise_pack, **READ, **options)
        list(it)
        it.hints.wait()
    assert calls == []
    monkeypatch.delenv("IMGPACK_READAHEAD_BYTES")
    it = open_iterable(noise_pack, **READ)
    list(it)
    it.hints.wait()
    assert calls  # the default does hint


def test_the_budget_bounds_what_is_hinted_ahead(tmp_path, monkeypatch):
    path = tmp_path / "data"
    path.write_bytes(b"\0" * (PIECE * 400))
    fd = os.open(path, os.O_RDONLY)
    rng = random.Random(0)
    plans = [[Extent(fd, rng.randrange(400) * PIECE + 100, 3 * PIECE) for _ in range(2)] for _ in range(60)]
    calls: list[tuple[int, int, int]] = []  # (group planned last, offset, length)
    planning = [0]
    monkeypatch.setattr(readahead, "advise", lambda f, off, n: calls.append((planning[0], off, n)))

    def plan(g):
        planning[0] = g
        return plans[g]

    budget = 2 << 20
    hints = ReadAhead(budget, threads=0)
    for current in range(len(plans)):
        hints.on_group("pass", plan, len(plans), current)
        ahead = sum(n for g, _, n in calls if g >= current)
        assert ahead <= budget, f"{ahead} bytes hinted ahead of group {current}"
    os.close(fd)
    assert 0 < hints.peak_ahead <= budget
    wanted = {(e.offset // PIECE + k) for p in plans for e in p for k in range(4)}
    got = [off // PIECE + k for _, off, n in calls for k in range(n // PIECE)]
    assert sorted(set(got)) == sorted(wanted)  # every piece a read needs was hinted,
    assert len(got) == len(set(got))  # and none twice
    assert all(n % PIECE == 0 and off % PIECE == 0 for _, off, n in calls)  # in aligned pieces


def test_the_readahead_option_and_its_variable(monkeypatch):
    assert open_iterable.__name__  # the option goes through ReadSpec like every other
    assert resolve_budget("16M") == 16 << 20 and resolve_budget("256KiB") == 256 << 10
    assert resolve_budget(0) == 0
    monkeypatch.setenv("IMGPACK_READAHEAD_BYTES", "1g")
    assert resolve_budget(None) == 1 << 30
    for bad in (-1, "lots", True):
        with pytest.raises(OptionError, match="readahead"):
            resolve_budget(bad)
    monkeypatch.setenv("IMGPACK_READAHEAD_BYTES", "x")
    with pytest.raises(OptionError, match="IMGPACK_READAHEAD_BYTES"):
        resolve_budget(None)


def write_env(path, count: int, seed: int = 0) -> dict[int, bytes]:
    """An LMDB file keyed like imgpack's: values inline (small) and on overflow pages (big)."""
    rng = random.Random(seed)
    values = {}
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(count):
            values[i] = os.urandom(rng.choice([0, 9, 300, 1900, 2100, 4096, 9000, 40000]))
            txn.put(struct.pack(">Q", i), values[i])
        txn.put(b"meta/labels", b"\1\2\3\4")
    assert env.stat()["depth"] >= 3  # a multi-level tree
    env.close()
    return values


def test_the_lmdb_page_table_matches_what_lmdb_reads(tmp_path):
    values = write_env(tmp_path / "data.mdb", 6000)
    fd = os.open(tmp_path / "data.mdb", os.O_RDONLY)
    table = PageTable(fd, 6002, "data.mdb")  # two indices more than the file holds
    assert list(table.value_offset[6000:]) == [-1, -1]
    for i, value in values.items():
        got = os.pread(fd, int(table.value_length[i]), int(table.value_offset[i]))
        assert got == value, f"key {i}"
    assert len(set(table.leaf_page[:6000].tolist())) > 10  # the values sit on many leaves
    os.close(fd)


def test_a_damaged_data_mdb_is_an_error_never_a_crash(tmp_path):
    write_env(tmp_path / "good.mdb", 3000)
    good = (tmp_path / "good.mdb").read_bytes()
    rng = random.Random(1)
    outcomes = {"table": 0, "error": 0}
    for trial in range(150):
        data = bytearray(good)
        for _ in range(rng.choice([1, 4, 32])):
            at = rng.randrange(4096 * 2 - 200, len(data)) if trial % 3 else rng.randrange(0, 8192)
            data[at] = rng.randrange(256)
        if trial % 10 == 0:
            data = data[: rng.randrange(len(data))]
        (tmp_path / "bad.mdb").write_bytes(bytes(data))
        fd = os.open(tmp_path / "bad.mdb", os.O_RDONLY)
        try:
            PageTable(fd, 3000, "bad.mdb")
            outcomes["table"] += 1
        except PageTableError as exc:
            assert "bad.mdb" in str(exc) and "re-pack" in str(exc)
            outcomes["error"] += 1
        finally:
            os.close(fd)
    assert outcomes["error"] > 0


def test_an_lmdb_pack_whose_tree_cannot_be_walked_reads_unhinted(packed, noise_folder, tmp_path):
    path = packed("lmdb", src=noise_folder)
    warm, _ = batches(path, 0, readahead=0)
    it = open_iterable(path, **READ)
    list(it.reader.read_many([0]))  # opens the environment
    opened = it.reader.handle(0)
    shutil.copy(path / "data-000000.lmdb" / "data.mdb", tmp_path / "zero.mdb")
    with open(tmp_path / "zero.mdb", "r+b") as fh:
        fh.write(b"\0" * 8192)  # both meta pages gone: no root to start from
    os.close(opened.fd)
    opened.fd = os.open(tmp_path / "zero.mdb", os.O_RDONLY)
    assert it.reader.extents(np.arange(10)) == []
    got = [(images.clone(), labels.clone()) for images, labels in it]
    assert same(got, warm) and it.hints.hinted_bytes == 0


def test_a_mix_read_with_the_cache_dropped_is_hinted_and_gives_the_warm_batches(packed, noise_folder):
    from readers import mix

    paths = [packed("lmdb", src=noise_folder), packed("tar", src=noise_folder)]

    def read(**options):
        m = mix(paths, weights=[0.5, 0.5], **READ, **options)
        got = [(images.clone(), labels.clone()) for images, labels in m]
        m.hints.wait()
        return got, m.hints.hinted_bytes

    warm, _ = read(readahead=0)
    for path in paths:
        uncache(path)
    cold, hinted = read()
    assert same(cold, warm) and hinted > 0


def test_pack_bench_cold_drops_the_pack_and_times_fresh_processes(packed, noise_folder, tmp_path):
    import json
    import shutil

    from tests.conftest import run_cli

    # A copy no live reader maps (an mmapped page is not dropped: other tests of this session
    # keep readers of the shared pack open in this process).
    path = tmp_path / "ds"
    shutil.copytree(packed("lmdb", src=noise_folder), path)
    out = tmp_path / "cold.json"
    args = ["bench", path, "--cold", "--records-only", "--rounds", "1", "--readahead", "16M", "-q"]
    run_cli(*args, "--workers", "0", "--batch-size", "8", "--crop", "64", "--json", out, check=True)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["resident_before_cold"] <= 0.01 and row["resident_before_warm"] > 0.9
    assert row["images"] == 480 and row["hinted_bytes"] > 0 and row["ratio"] > 0
    bad = run_cli("bench", path, "--cold", "--readahead", "lots")
    assert bad.returncode != 0 and "--readahead" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.root
def test_pack_bench_memory_cap_reports_the_reading_trees_own_memory(packed, noise_folder, tmp_path):
    """--memory-cap runs the cold epoch in a memory cgroup and says how much of it the reading
    processes needed for themselves (anonymous memory, sampled from the cgroup), beside the cap."""
    import json
    import shutil

    from tests.conftest import run_cli

    path = tmp_path / "ds"
    shutil.copytree(packed("lmdb", src=noise_folder), path)
    out = tmp_path / "capped.json"
    args = ["bench", path, "--memory-cap", "400M", "--records-only", "--rounds", "1", "--readahead", "16M"]
    args += ["-q", "--workers", "0", "--batch-size", "8", "--crop", "64", "--json", str(out)]
    done = run_cli(*args, check=True)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["cap_bytes"] == 400 << 20 and row["images"] == 480
    # a Python process with torch imported holds tens of MiB of its own, and the cap bounds it
    assert 20 << 20 < row["cap_peak_anonymous_bytes"] <= row["cap_bytes"]
    (summary,) = json.loads(out.read_text())["summary"]
    assert summary["tree_anonymous_bytes"] == row["cap_peak_anonymous_bytes"]
    own = f"{row['cap_peak_anonymous_bytes'] >> 20} MiB"
    assert "tree's own memory" in done.stdout and own in done.stdout


def test_pack_bench_cold_reads_the_tar_shards_by_webdataset_beside_imgpack(packed, noise_folder, tmp_path):
    """--peer webdataset: the same shards, the same conditions (a fresh process per epoch, the
    pack dropped from the cache before the cold one), webdataset's own reader and decoder."""
    import json
    import shutil

    from tests.conftest import run_cli

    path = tmp_path / "ds"
    shutil.copytree(packed("tar", src=noise_folder), path)
    out = tmp_path / "cold.json"
    args = ["bench", path, "--cold", "--peer", "webdataset", "--rounds", "1", "--readahead", "16M", "-q"]
    done = run_cli(*args, "--workers", "0", "--batch-size", "8", "--crop", "32", "--json", out, check=True)
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["peer"] for r in rows) == ["", "webdataset"]
    assert all(r["images"] == 480 and r["resident_before_cold"] <= 0.01 for r in rows)
    assert "| webdataset (tar) | its own |" in done.stdout and "| tar | 16 MiB |" in done.stdout
    for wrong in (["--records-only"], []):
        target = path if wrong else packed("lmdb", src=noise_folder)
        bad = run_cli("bench", target, "--cold", "--peer", "webdataset", *wrong)
        assert bad.returncode != 0 and "--peer" in bad.stderr and "Traceback" not in bad.stderr


def test_a_hinted_file_gets_no_kernel_readahead_past_what_is_read(tmp_path):
    """Two neighbouring reads look sequential to the kernel, which then reads far past them
    (read_ahead_kb); a file the hints have taken over is read where it is asked, no further."""
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(32 << 20))
    os.sync()

    def read_past(take_over: bool) -> float:
        evict(blob)
        fd = os.open(blob, os.O_RDONLY)
        try:
            if take_over:
                hints = ReadAhead(1 << 20, threads=0)
                hints.on_group("pass", lambda g: [Extent(fd, 0, PIECE)], 1, 0)
            for k in range(16):  # 16 x 64 KiB, each after the last: a sequential stream
                os.pread(fd, 64 << 10, (8 << 20) + k * (64 << 10))
            return resident([(fd, 9 << 20, 8 << 20)])  # the 8 MiB past the reads
        finally:
            os.close(fd)

    assert read_past(take_over=True) == 0.0
    assert read_past(take_over=False) > 0.05  # the control: the kernel read ahead of the stream


def test_hints_cover_the_records_a_block_read_takes_with_it(packed, noise_folder):
    """A block read takes the records in its gaps (up to the format's merge gap) too: they are
    hinted with it, or they would come from the disk one by one at read time."""
    from readers.formats import open_reader

    reader = open_reader(packed("tar", src=noise_folder))
    try:
        reader.read_many([0])  # opens the shard: hints never open one
        (extent,) = reader.extents(np.array([2, 6]))
        index = reader.handle(0).index
        wanted = {b for k in range(2, 7) for b in range(int(index.image_offset[k]), int(index.end[k]))}
        covered = set()
        for offset, length in zip(np.atleast_1d(extent.offset), np.atleast_1d(extent.length)):
            covered.update(range(int(offset), int(offset + length)))
        assert wanted - covered == set(), "bytes of records 3-5, read with 2 and 6, not hinted"
    finally:
        reader.close()
