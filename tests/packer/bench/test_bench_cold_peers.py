"""``pack bench --cold --peer ffcv``: the command FFCV's epoch runs (its setting for data larger
than memory), the ``.beton``'s stored bytes, what is evicted and counted for a peer with files of
its own, and the option checks. FFCV's own venv is not needed: what runs with it is checked as the
command and settings it is handed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from packer.bench import _cold, _ffcv_peer
from packer.bench._cold import ColdSettings, epoch_command, format_cold, run_cold
from packer.bench.ffcv_epoch import Exported, loader_options
from packer.bench.harness import BenchError
from packer.bench.pagecache import dataset_files, dataset_resident, evict
from readers.formats import open_reader
from tests.conftest import run_cli


def beton_of(path, images: int = 46, short: tuple[int, int] = (256, 300)) -> _ffcv_peer.Beton:
    return _ffcv_peer.Beton(path, os.path.getsize(path), images, short)


def test_ffcv_reads_the_beton_uncached_in_quasi_random_order(tmp_path):
    """FFCV's recommended setting for data larger than memory, the bench's workers, batch and crop."""
    (tmp_path / "ds.beton").write_bytes(b"\0" * 4096)
    beton = beton_of(tmp_path / "ds.beton", short=(256, 300))
    settings = ColdSettings(workers=3, batch_size=32, crop=224, seed=7, ffcv_python="/opt/ffcv/bin/python")
    cmd = epoch_command("ds.lmdb", settings, 0, 2, peer="ffcv", beton=beton)
    assert cmd[:4] == ["/opt/ffcv/bin/python", "-m", "packer.bench.ffcv_epoch", "read"]
    handed = json.loads(cmd[4])
    assert handed["os_cache"] is False and handed["order"] == "QUASI_RANDOM"
    assert handed["beton"] == str(tmp_path / "ds.beton") and handed["epoch"] == 2 and handed["crop"] == 224
    assert int(handed["ratio"] * 256) == 224  # the same 224 px window of the shortest side imgpack takes
    options = loader_options(handed)  # what the child hands ffcv.loader.Loader
    assert options["os_cache"] is False and options["order"] == "QUASI_RANDOM" and not options["drop_last"]
    assert (options["num_workers"], options["batch_size"], options["seed"]) == (3, 32, 7)
    imgpack = epoch_command("ds.lmdb", settings, 0, 2)
    assert imgpack[:3] == [sys.executable, "-m", "packer.bench.cold_epoch"]
    with pytest.raises(BenchError, match="beton"):
        epoch_command("ds.lmdb", settings, 0, 2, peer="ffcv")
    one = ColdSettings(workers=0)  # imgpack in its main process: FFCV on one thread, not every core
    assert json.loads(epoch_command("ds.lmdb", one, 0, 0, peer="ffcv", beton=beton)[4])["workers"] == 1


def test_the_beton_export_keeps_the_stored_bytes(packed, tmp_path):
    path = packed("lmdb", resize=64)
    facts = _ffcv_peer.export_records(str(path), tmp_path / "export")
    exported, reader = Exported(tmp_path / "export"), open_reader(path)
    assert len(exported) == len(reader) == facts["images"] > 0
    for i in range(len(reader)):
        (mode, height, width, data), label = exported[i]
        rec = reader.read(i)
        assert (mode, height, width, label) == ("jpg", rec.height, rec.width, rec.label)
        assert bytes(data) == bytes(rec.data)  # not re-encoded
    assert facts["short_side"][0] == 64  # --resize 64: the shorter side


def test_the_beton_export_takes_raw_pixels_and_refuses_png(packed, tmp_path):
    raw = _ffcv_peer.export_records(str(packed("lmdb", resize=32, crop=32, encode="raw")), tmp_path / "raw")
    (mode, height, width, data), _ = Exported(tmp_path / "raw")[0]
    assert (mode, height, width, len(data)) == ("raw", 32, 32, 32 * 32 * 3) and raw["short_side"] == [32, 32]
    with pytest.raises(BenchError, match="--encode jpeg"):
        _ffcv_peer.export_records(str(packed("lmdb", resize=32, encode="png")), tmp_path / "png")
    from PIL import Image

    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    for k in range(3):  # a folder of JPEGs packed as they are ("original"): FFCV takes their bytes
        (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (k * 80, 20, 90)).save(tmp_path / "src" / "c" / f"{k}.jpg")
    pack_folder(tmp_path / "src", tmp_path / "orig", "lmdb", PreprocessSpec(encode="original"), workers=1)
    kept = _ffcv_peer.export_records(str(tmp_path / "orig"), tmp_path / "original")
    (mode, _, _, data), _ = Exported(tmp_path / "original")[0]
    assert mode == "jpg" and bytes(data[:3]) == b"\xff\xd8\xff" and kept["images"] == 3


def test_a_beton_is_written_once_per_manifest(packed, tmp_path):
    """A complete .beton (its sidecar written last) is reused; a failing writer leaves nothing behind
    and says which file and what went wrong."""
    path = str(packed("lmdb", resize=64))
    with pytest.raises(BenchError, match="FFCV's writer .* exited 1: .*No module named 'ffcv'"):
        _ffcv_peer.ensure_beton(path, str(tmp_path), sys.executable, 1, lambda m: None)  # no FFCV here
    assert list(tmp_path.iterdir()) == []
    where = _ffcv_peer.beton_path(path, str(tmp_path))
    assert where.parent == tmp_path and where.name.startswith("ds-") and where.suffix == ".beton"
    where.write_bytes(b"\1" * 5000)  # as a previous run left it
    where.with_suffix(".json").write_text(json.dumps({"images": 46, "short_side": [64, 90], "bytes": 5000}))
    beton = _ffcv_peer.ensure_beton(path, str(tmp_path), "/no/such/python", 1, lambda m: None)
    assert beton == _ffcv_peer.Beton(where, 5000, 46, (64, 90))
    where.write_bytes(b"\1" * 10)
    with pytest.raises(BenchError, match="delete"):
        _ffcv_peer.ensure_beton(path, str(tmp_path), "/no/such/python", 1, lambda m: None)


def test_evict_and_resident_take_one_file(tmp_path):
    one = tmp_path / "ds.beton"
    one.write_bytes(os.urandom(1 << 20))
    one.read_bytes()
    assert dataset_files(one) == [one]
    assert evict(one) == 1 << 20 and dataset_resident(one) <= 0.01


def test_a_peer_with_files_of_its_own_is_evicted_and_counted_by_them(packed, tmp_path, monkeypatch):
    """The FFCV rows name the .beton as what is read, drop it (not the dataset) before the cold
    epoch, and count its bytes for bytes per image (the ceiling) and dataset / cap."""
    path = str(packed("lmdb", resize=64))
    images = len(open_reader(path))
    beton_file = tmp_path / "peers" / "ds.beton"
    beton_file.parent.mkdir()
    beton_file.write_bytes(os.urandom(3 << 20))  # far more than the dataset: the figures must differ
    beton = beton_of(beton_file, images, (64, 64))
    monkeypatch.setattr(_ffcv_peer, "ensure_beton", lambda *args: beton)
    epochs = []

    def fake_epoch(path, settings, readahead, epoch, cap=None, peer="", beton=None):
        if peer == "ffcv":
            beton_file.read_bytes()  # what FFCV would read
        epochs.append((peer, beton))
        rate = 100.0  # warm and cold alike: the ceiling is the disk's, per image
        figures = {"rate": rate, "epoch_rate": rate / 2, "images": images, "first_batch_s": 0.5}
        return {**figures, "hinted_bytes": 0, "peak_rss_bytes": 1, "peak_anonymous_bytes": None}

    monkeypatch.setattr(_cold, "run_epoch", fake_epoch)
    settings = ColdSettings(rounds=1, readahead=(0,), peers=("ffcv",), peer_dir=str(tmp_path / "peers"))
    report = run_cold([path], settings)
    assert {(peer, b) for peer, b in epochs} == {("", None), ("ffcv", beton)}
    rows = {r["peer"]: r for r in report["rows"]}
    assert rows["ffcv"]["read"] == str(beton_file) and rows["ffcv"]["bytes"] == 3 << 20
    assert rows["ffcv"]["resident_before_warm"] > 0.9 and rows["ffcv"]["resident_before_cold"] <= 0.01
    assert rows["ffcv"]["format"] == "ffcv (lmdb)" and rows[""]["read"] == path
    assert rows[""]["bytes"] < 1 << 20  # the dataset's own files
    disk = report["conditions"]["disk_bytes_per_s"]
    summary = {s["peer"]: s for s in report["summary"]}
    for peer, s in summary.items():
        per_image = rows[peer]["bytes"] / images
        assert s["of_ceiling"] == pytest.approx(100.0 / min(100.0, disk / per_image))
        assert s["first_batch_s"] == [0.5, 0.5]
    report["conditions"]["settings"]["memory_cap"] = 1 << 20
    table = format_cold(report)
    assert "| ffcv (lmdb) | its own |" in table and "| 3.0x |" in table  # the .beton's 3 MiB / 1 MiB cap


def fake_ffcv_python(folder):
    """A Python that can ``import ffcv.loader`` (an empty package), so the checks after it are reached."""
    (folder / "fake" / "ffcv").mkdir(parents=True, exist_ok=True)
    (folder / "fake" / "ffcv" / "__init__.py").write_text("")
    (folder / "fake" / "ffcv" / "loader.py").write_text("")
    python = folder / "fake-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={folder / "fake"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_beton_has_the_page_size_asked_for(packed, tmp_path, monkeypatch):
    """FFCV's memory with os_cache=False is whole pages: --ffcv-page-size writes a .beton of its own
    (named by the size), hands the size to FFCV's writer, and names it in the table."""
    path = str(packed("lmdb", resize=64))
    default = _ffcv_peer.beton_path(path, str(tmp_path))
    small = _ffcv_peer.beton_path(path, str(tmp_path), 2 << 20)
    assert small != default and small.name.endswith("-pages2M.beton") and small.parent == default.parent
    assert _ffcv_peer.page_size_problem(2 << 20) is None and _ffcv_peer.page_size_problem(8 << 20) is None
    assert _ffcv_peer.page_size_problem(1 << 20) and _ffcv_peer.page_size_problem(3 << 20)
    handed = []

    def fake_run(cmd, **kwargs):
        handed.append(json.loads(cmd[4]))
        open(handed[-1]["beton"], "wb").write(b"\1" * 100)  # what the writer leaves
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(_ffcv_peer.subprocess, "run", fake_run)
    beton = _ffcv_peer.ensure_beton(path, str(tmp_path), "/ffcv/python", 1, lambda m: None, 2 << 20)
    assert handed[0]["page_size"] == 2 << 20 and beton.path == small and beton.bytes == 100
    assert _cold.peer_name("ffcv", ColdSettings(ffcv_page_size=2 << 20)) == "ffcv, 2 MiB pages"
    assert _cold.peer_name("ffcv", ColdSettings()) == "ffcv" and _cold.peer_name("webdataset", ColdSettings())


def test_the_cli_checks_the_ffcv_options(packed, tmp_path):
    from packer.bench.cli import compare

    path = packed("lmdb", resize=64)
    defaults = {p.name: p.default for p in compare.params}
    assert defaults["ffcv_python"] == _ffcv_peer.DEFAULT_PYTHON
    cases = [
        (["--ffcv-python", str(tmp_path / "none")], ["--ffcv-python", "none: no such Python", "ffcv==1.0.2"]),
        (["--ffcv-python", sys.executable], ["--ffcv-python", "cannot import ffcv", "python3 -m venv"]),
        (["--records-only"], ["--peer", "drop --records-only"]),
        (["--peer-dir", str(path / "peers")], ["--peer-dir", "inside the dataset"]),
        (["--ffcv-page-size", "3M"], ["--ffcv-page-size", "power of 2 from 2 MiB"]),
        (["--ffcv-page-size", "1M"], ["--ffcv-page-size", "power of 2 from 2 MiB"]),
        (["--ffcv-page-size", "lots"], ["--ffcv-page-size"]),
    ]
    for extra, said in cases:
        python = [] if "--ffcv-python" in extra else ["--ffcv-python", str(fake_ffcv_python(tmp_path))]
        bad = run_cli("bench", path, "--cold", "--peer", "ffcv", *python, *extra)
        assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr
        assert all(words in bad.stderr for words in said), bad.stderr
    assert not (path / "peers").exists()


def test_epoch_rates_leave_out_the_process_start():
    """Each epoch is a fresh process: its start (workers, FFCV's compilation) is timed apart."""
    long = {"images": 1000, "seconds": 12.0, "first_batch_s": 10.0, "first_batch_images": 64}
    assert _cold.steady_rate(long) == pytest.approx(936 / 2.0)
    one_batch = {"images": 64, "seconds": 2.0, "first_batch_s": 2.0, "first_batch_images": 64}
    assert _cold.steady_rate(one_batch) == 32  # nothing after the first batch: the whole epoch
    assert _cold.steady_rate({"images": 10, "seconds": 5.0}) == 2.0  # no first-batch figure


def test_device_read_bytes_counts_what_an_evicted_file_costs_the_disk(tmp_path):
    from packer.bench.pagecache import device_read_bytes, evict

    path = tmp_path / "blob"
    path.write_bytes(os.urandom(8 << 20))
    os.sync()
    evict(path)
    before = device_read_bytes(path)
    assert before is not None  # tmp_path is on the machine's disk, as the benchmark datasets are
    path.read_bytes()
    assert device_read_bytes(path) - before >= 8 << 20
    assert device_read_bytes("/dev/shm") is None  # a tmpfs has no block device


def test_an_epoch_past_its_timeout_is_stopped_and_a_clear_error(monkeypatch, tmp_path):
    marker = tmp_path / "pid"
    sleeper = [
        sys.executable,
        "-c",
        f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    ]
    monkeypatch.setattr(_cold, "epoch_command", lambda *args, **kwargs: sleeper)
    with pytest.raises(
        BenchError,
        match=r"ds.lmdb by ffcv: an epoch ran past 1 s and was stopped; give a larger --epoch-timeout",
    ):
        _cold.run_epoch("ds.lmdb", ColdSettings(timeout=1), 0, 0, peer="ffcv")
    pid = int(marker.read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
