"""Trust, round 3 (issue 25), the reading side: damaged indexes and manifests name their file and
field, remote reads stay inside their time bound, cache and reindex errors say the real cause,
first-day frictions (bench baseline, half-made output, DataLoader workers, pack info / verify)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from packer.verify import verify_dataset
from readers import open_dataset, open_iterable
from readers.checksums import file_sha256
from readers.errors import ImgpackError, ManifestError
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli
from tests.helpers_damage import edit_manifest
from tests.helpers_disks import mounted_tmpfs
from tests.helpers_formats import formats_with_index_files, parts_hold_the_images

SPLIT = {"samples_per_shard": 20}  # 44 samples: shards of 20, 20, 4
SMALL = {"resize": 32, "crop": 32}


def copy_of(packed, fmt: str, tmp_path: Path) -> Path:
    root = tmp_path / fmt
    shutil.copytree(packed(fmt, options=SPLIT, **SMALL), root, symlinks=True)
    return root


def read_all(root: Path) -> None:
    dataset = open_dataset(root)
    for i in range(len(dataset)):
        dataset[i]


def assert_one_line(proc, *needles: str, rc: int = 1) -> str:
    """A CLI run that failed with one line naming ``needles`` (no traceback)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == rc, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


# -- 11: a damaged TFRecord index or a shard replaced by a directory names the file ---------------
def _non_ascii(idx: Path) -> None:
    idx.write_bytes("café 12\n".encode())


def _negative(idx: Path) -> None:
    rows = [line.split() for line in idx.read_text().splitlines()]
    idx.write_text("".join(f"{int(o) - 100} {s}\n" for o, s in rows))


@pytest.mark.parametrize(
    "damage, needle",
    [(_non_ascii, "is not ASCII"), (_negative, "first record at byte -100")],
    ids=["non-ascii", "negative-offsets"],
)
def test_damaged_tfrecord_index_names_the_file(packed, tmp_path, damage, needle):
    root = copy_of(packed, "tfrecord", tmp_path)
    idx = root / "shard-000000.idx"
    damage(idx)
    with pytest.raises(ManifestError, match=re.escape(str(idx)) + ".*" + needle + ".*pack reindex"):
        read_all(root)
    with pytest.raises(ManifestError, match=needle):
        for _ in open_iterable(root, batch_size=8, crop=32):
            pass
    assert_one_line(run_cli("verify", root), str(idx), needle)
    assert_one_line(run_cli("show", root, "-o", tmp_path / "grid.png"), str(idx), needle)


@pytest.mark.parametrize("fmt", formats_with_index_files())
def test_shard_replaced_by_a_directory_names_the_file(packed, tmp_path, fmt):
    root = copy_of(packed, fmt, tmp_path)
    shard = root / json.loads((root / "manifest.json").read_text())["shards"][0]["file"]
    shard.unlink()
    shard.mkdir()
    needle = "is a directory or special file"
    with pytest.raises(ManifestError, match=re.escape(str(shard)) + ": " + needle):
        read_all(root)
    assert_one_line(run_cli("verify", root), str(shard), needle, "44 samples in 3 shard(s): FAILED")
    assert_one_line(run_cli("show", root, "-o", tmp_path / "grid.png"), str(shard), needle)


# -- 12: manifest integers and HDF5 shapes are bounded, the field named ---------------------------
def test_manifest_number_of_5000_digits_names_the_field(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    path = root / "manifest.json"
    path.write_text(re.sub(r'"num_samples": \d+', '"num_samples": ' + "9" * 5000, path.read_text()))
    needle = "field 'num_samples' is a number of more than 30 digits"
    with pytest.raises(ManifestError, match=needle):
        open_dataset(root)
    assert_one_line(run_cli("info", root), needle)
    assert_one_line(run_cli("verify", root), needle)


def test_huge_number_deep_in_the_manifest_names_its_field(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    path = root / "manifest.json"
    text = re.sub(r'"bytes": \d+', '"bytes": ' + "7" * 4400, path.read_text(), count=1)
    path.write_text(text)
    with pytest.raises(ManifestError, match=r"field 'shards\[0\].bytes' is a number of more than 30"):
        open_dataset(root)


def test_hdf5_shapes_entry_beyond_the_stored_sizes_is_named(packed, tmp_path):
    root = copy_of(packed, "hdf5", tmp_path)
    part = root / "data-000001.h5"
    with h5py.File(part, "r+") as fh:
        fh["shapes"][3] = (100000, 100000, 3)
    needle = re.escape(str(part)) + ": 'shapes' row 3 is 100000x100000x3, beyond the largest stored"
    with pytest.raises(ManifestError, match=needle):
        for _ in open_iterable(root, batch_size=8, resize=32, crop=32):
            pass
    assert_one_line(run_cli("info", root), "'shapes' row 3")


# -- 20: pack info sees broken parts; pack verify's summary and hints ------------------------------
def test_pack_info_reports_a_truncated_lmdb(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    data = root / "data-000000.lmdb" / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    text = assert_one_line(run_cli("info", root), str(data), "truncated", f"pack verify {root}")
    assert "samples   44" in text  # the description is still printed
    assert run_cli("info", copy_of(packed, "tar", tmp_path)).returncode == 0


def test_verify_summary_counts_what_the_manifest_lists(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    shutil.rmtree(root / "data-000002.lmdb")
    report = verify_dataset(root)
    assert not report.ok and (report.samples, report.shards) == (44, 3)  # not "0 samples in 0 shard(s)"


def test_pack_verify_of_an_image_file_says_it_is_a_file(tmp_path):
    image = next(SAMPLE_DATA.rglob("*.jpg"))
    text = assert_one_line(run_cli("verify", image), "a file, not a packed dataset")
    assert f"pack imagefolder {image}" not in text
    packed_manifest = tmp_path / "ds" / "manifest.json"
    packed_manifest.parent.mkdir()
    packed_manifest.write_text("{}")
    assert_one_line(run_cli("info", packed_manifest), f"open its directory {packed_manifest.parent}")


# -- 16: pack reindex refuses member names the index format cannot hold --------------------------
def _rename_members(shard: Path, rename) -> None:
    """Rewrite a tar shard with every member renamed by ``rename`` (same bytes, same order)."""
    import tarfile

    members = []
    with tarfile.open(shard) as archive:
        for info in archive:
            members.append((info, archive.extractfile(info).read()))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as archive:
        for info, data in members:
            info.name = rename(info.name)
            archive.addfile(info, io.BytesIO(data))


def test_reindex_of_member_names_with_a_space_is_refused(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    shard = root / "shard-000001.tar"
    _rename_members(shard, lambda name: name.replace("s", "s ", 1))
    entry = {"bytes": shard.stat().st_size, "sha256": file_sha256(shard)}
    edit_manifest(root, lambda m: m["shards"][1].update(entry))
    before = (root / "shard-000001.idx").read_bytes()
    assert_one_line(run_cli("reindex", root), str(shard), "has white space in its name", "rename the members")
    assert (root / "shard-000001.idx").read_bytes() == before  # nothing half-written
    (root / "shard-000001.idx").unlink()  # the reader's own rebuild says the same
    with pytest.raises(ManifestError, match="has white space in its name"):
        read_all(root)


# -- 17: the bench baseline skips what the packer skipped, and says so ----------------------------
def _source_with_a_truncated_jpeg(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA, src)
    victim = sorted((src / "animals").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return src, victim


def test_bench_baseline_skips_what_the_packer_skipped(tmp_path):
    src, victim = _source_with_a_truncated_jpeg(tmp_path)
    out = tmp_path / "ds"
    run_cli(
        "imagefolder", src, "--to", "lmdb", "-o", out, "--resize", "32", "--crop", "32", "--quiet", check=True
    )
    report = tmp_path / "bench.json"
    args = ("--workers", "0", "--epochs", "1", "--random-reads", "4", "--json", report, "--quiet")
    proc = run_cli("bench", out, "--baseline", src, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    relative = victim.relative_to(src).as_posix()
    assert f"the baseline skips the 1 file(s) that packing {out} skipped (first: {relative}" in proc.stdout
    counts = {d["name"]: d["num_samples"] for d in json.loads(report.read_text())["datasets"]}
    assert sorted(counts.values()) == [43, 43], counts


def test_bench_baseline_names_a_file_it_cannot_decode(tmp_path):
    from packer.bench.baseline import ImageFolderBaseline
    from readers.errors import DecodeError

    src, victim = _source_with_a_truncated_jpeg(tmp_path)
    baseline = ImageFolderBaseline(src, {"resize": 32, "crop": 32})
    index = [path for path, _ in baseline.samples].index(str(victim))
    with pytest.raises(DecodeError, match=re.escape(str(victim)) + ": the baseline cannot decode it"):
        baseline[index]


# -- 18: a pack that skipped every image leaves nothing half-made ----------------------------------
def _unreadable_folder(tmp_path: Path) -> Path:
    src = tmp_path / "junk"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        (src / cls / "x.jpg").write_bytes(b"not a jpeg")
    return src


@pytest.mark.parametrize("fmt", format_names())
def test_pack_that_skipped_everything_leaves_no_half_made_output(packed, tmp_path, fmt):
    src, out = _unreadable_folder(tmp_path), tmp_path / "out"
    needle = "every image was skipped (2), so no dataset was written"
    for extra in ((), (), ("--resize", "32", "--resume")):  # a retry, then a retry with other options
        assert_one_line(run_cli("imagefolder", src, "--to", fmt, "-o", out, "--quiet", *extra), needle)
        assert not any(out.iterdir()), list(out.iterdir())
    existing = tmp_path / "existing"
    shutil.copytree(packed(fmt, options=SPLIT, **SMALL), existing)
    before = sorted(p.name for p in existing.iterdir())
    assert_one_line(run_cli("imagefolder", src, "--to", fmt, "-o", existing, "--force", "--quiet"), needle)
    assert sorted(p.name for p in existing.iterdir()) == before  # the old dataset, no staging left
    assert len(open_dataset(existing)) == 44


def test_remote_pack_that_skipped_everything_leaves_nothing(s3, tmp_path):
    fs, options = s3
    src, url = _unreadable_folder(tmp_path), "s3://imgpack-test/all-skipped"
    storage = ("--storage-options", json.dumps(options))
    for _ in range(2):
        proc = run_cli("imagefolder", src, "--to", "tar", "-o", url, "--quiet", *storage)
        assert_one_line(proc, "every image was skipped (2), so no dataset was written")
        assert not fs.exists(url) or not fs.find(url), fs.find(url)


# -- 19: a DataLoader that batches whole batches again: one clear line from the workers too -------
DOUBLE_BATCH = """
import sys
from torch.utils.data import DataLoader
from readers import open_iterable
it = open_iterable(sys.argv[1], batch_size=8, crop=32, shuffle=True, seed=0)
for batch in DataLoader(it, batch_size=64, num_workers=2, persistent_workers=True):
    pass
"""


def test_double_batching_in_workers_is_one_clear_line(packed):
    from tests.conftest import cli_env

    root = packed("tar", options=SPLIT, **SMALL)
    proc = subprocess.run(
        [sys.executable, "-c", DOUBLE_BATCH, str(root)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "readers.whole_batch.WholeBatchCollatedError: open_iterable(batch_size=B) already"
    ), last
    assert "DataLoader(dataset, batch_size=None, ...)" in last and "in DataLoader worker process" in last
    assert "Original Traceback" not in proc.stderr and "Caught WholeBatchCollatedError" not in proc.stderr


# -- 14: a stalled S3 server (SIGSTOP) is a RemoteError within the configured bound -------------
BOUND = 3  # seconds ($IMGPACK_REMOTE_TIMEOUT); the default is 120


@pytest.fixture
def stoppable_s3():
    from tests.s3server import moto_s3_process

    with moto_s3_process() as server:
        yield server


@contextlib.contextmanager
def stopped(proc):
    """The server process frozen (SIGSTOP): connections are accepted by the kernel, never answered."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_remote_call_bound_defaults_and_setting(monkeypatch):
    from readers.errors import OptionError
    from readers.remote import bounded_options, call_bound

    monkeypatch.delenv("IMGPACK_REMOTE_TIMEOUT", raising=False)
    assert call_bound() == 120
    config = bounded_options("s3://b/x", None)["config_kwargs"]
    assert (config["connect_timeout"], config["read_timeout"]) == (10, 30)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", "8")
    config = bounded_options("s3://b/x", None)["config_kwargs"]
    assert call_bound() == 8 and (config["connect_timeout"], config["read_timeout"]) == (2, 2)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", "soon")
    with pytest.raises(OptionError, match="IMGPACK_REMOTE_TIMEOUT='soon': must be a positive number"):
        call_bound()


@pytest.mark.parametrize("workers", [0, 2])
def test_stalled_server_mid_read_is_a_remote_error_within_the_bound(
    packed, stoppable_s3, monkeypatch, workers
):
    from readers import make_loader
    from readers.remote import RemoteError

    fs, options, proc = stoppable_s3
    fs.put(str(packed("tar", options=SPLIT, **SMALL)), "imgpack-test/ds", recursive=True)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", str(BOUND))
    monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "2k")  # else the pass is fetched before the stall
    it = open_iterable("s3://imgpack-test/ds", batch_size=4, crop=32, storage_options=options, block_size=4)
    batches = iter(make_loader(it, num_workers=workers))
    next(batches)
    with stopped(proc):
        started = time.monotonic()
        with pytest.raises(
            RemoteError, match=r"s3://imgpack-test/ds/shard-.*no answer from the server for 3 s"
        ):
            for _ in batches:
                pass
        waited = time.monotonic() - started
    assert waited < 4 * BOUND, waited  # before: ~16 request timeouts per call (575 s at the defaults)
    monkeypatch.delenv("IMGPACK_REMOTE_TIMEOUT")  # the resumed server first answers the abandoned calls
    assert len(open_dataset("s3://imgpack-test/ds", storage_options=options)) == 44


def _cli_until_stalled(args, proc, ready, env) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``pack ARGS``, freeze the server once ``ready()`` holds, and time the exit."""
    child = subprocess.Popen(
        [sys.executable, "-m", "packer.cli", *map(str, args)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with stopped(proc):
        started = time.monotonic()
        try:
            out, err = child.communicate(timeout=60)
        finally:
            child.kill()
        waited = time.monotonic() - started
    return subprocess.CompletedProcess(args, child.returncode, out, err), waited


def test_stalled_server_mid_pack_is_one_line_within_the_bound(stoppable_s3, tmp_path):
    from tests.conftest import cli_env

    fs, options, proc = stoppable_s3
    env = {**cli_env(), "IMGPACK_REMOTE_TIMEOUT": str(BOUND)}
    storage = ("--storage-options", json.dumps(options), "--samples-per-shard", "4", "--quiet")
    out = "s3://imgpack-test/out"
    args = ("imagefolder", SAMPLE_DATA, "--to", "tar", "-o", out, *storage)
    done, waited = _cli_until_stalled(args, proc, lambda: fs.exists(f"{out}/.imgpack-progress.json"), env)
    assert_one_line(done, out, "no answer from the server for 3 s")
    assert waited < 4 * BOUND, waited  # before: 229 s and more at the defaults
    fs.put(str(SAMPLE_DATA), "imgpack-test/src", recursive=True)
    args = ("imagefolder", "s3://imgpack-test/src", "--to", "tar", "-o", tmp_path / "local", *storage)
    done, waited = _cli_until_stalled(args, proc, lambda: (tmp_path / "local").exists(), env)
    assert_one_line(done, "s3://imgpack-test/src", "no answer from the server for 3 s")
    assert waited < 4 * BOUND, waited


# -- 15: a damaged cached index is fetched again; a full cache disk is named as such --------------
def _upload(s3, packed, fmt: str, name: str) -> str:
    fs, _ = s3
    fs.put(str(packed(fmt, options=SPLIT, **SMALL)), f"imgpack-test/{name}", recursive=True)
    return f"s3://imgpack-test/{name}"


def _garbage(text: str) -> str:
    return "v1.2 x\nnot an index\n"


def _swapped(text: str) -> str:
    """Still a well-formed index, but of other byte ranges (only verify=True can tell)."""
    lines = text.splitlines()
    fields = lines[1].split()
    fields[2] = str(int(fields[2]) - 1)  # one byte shorter image member
    return "\n".join([lines[0], " ".join(fields), *lines[2:]]) + "\n"


@pytest.mark.parametrize(
    "fmt, damage, verify",
    [*((fmt, _garbage, False) for fmt in formats_with_index_files()), ("tar", _swapped, True)],
    ids=[*(f"{fmt}-garbage" for fmt in formats_with_index_files()), "tar-plausible-verify"],
)
def test_damaged_cached_index_is_fetched_again(s3, packed, tmp_path, fmt, damage, verify):
    fs, options = s3
    url = _upload(s3, packed, fmt, f"cached-idx-{fmt}-{verify}")
    cache = tmp_path / "cache"
    reference = [open_dataset(url, storage_options=options, cache_dir=cache)[i][1] for i in range(44)]
    idx = next(cache.glob("*.idx"))
    good = idx.read_text()
    idx.write_text(damage(good))
    with pytest.warns(UserWarning, match=re.escape(str(idx)) + ": cached index is damaged .* fetching s3://"):
        dataset = open_dataset(url, storage_options=options, cache_dir=cache, verify=verify)
        assert [dataset[i][1] for i in range(44)] == reference
    assert idx.read_text() == good  # the cache holds the remote copy again


def test_damaged_remote_index_is_blamed_on_the_remote_copy(s3, packed, tmp_path):
    fs, options = s3
    url = _upload(s3, packed, "tar", "bad-remote-idx")
    fs.pipe(f"{url.removeprefix('s3://')}/shard-000000.idx", b"v1.2 x\n")
    with pytest.raises(ManifestError, match=re.escape(f"{url}/shard-000000.idx") + ": not a v1.2"):
        read_all_remote(url, options, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.idx"))  # a bad copy is not cached


def read_all_remote(url: str, options: dict, cache: Path) -> None:
    dataset = open_dataset(url, storage_options=options, cache_dir=cache)
    for i in range(len(dataset)):
        dataset[i]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 16 KB tmpfs: smaller than one part of the test datasets."""
    with mounted_tmpfs(tmp_path / "tiny", "16k") as mount:
        yield mount


@pytest.mark.parametrize("fmt", format_names())
def test_full_cache_disk_is_named_not_blamed_on_the_server(s3, packed, tiny_disk, fmt):
    from readers.remote import CacheError

    fs, options = s3
    url = _upload(s3, packed, fmt, f"full-cache-{fmt}")
    if not parts_hold_the_images(packed(fmt, options=SPLIT, **SMALL)):
        read_all_remote(url, options, tiny_disk)  # only small indexes are cached: they fit
        return
    with pytest.raises(
        CacheError, match=re.escape(str(tiny_disk)) + r".*the cache's disk is full.*free space"
    ):
        read_all_remote(url, options, tiny_disk)


# -- beyond the probe: DALI on damaged datasets, remote tar, a killed py_workers process -----------
def _damaged(tmp_path: Path, fmt: str, damage: str) -> Path:
    """A copy of a 44-sample dataset with one image of part 1 corrupted, or part 1 truncated."""
    from packer.engine import pack_folder
    from packer.preprocess import PreprocessSpec

    root = tmp_path / f"{fmt}-{damage}"
    # One process: this test process already runs DALI and fsspec threads, which a fork copies.
    spec = PreprocessSpec(encode="bmp" if fmt == "bmp" else "jpeg", **SMALL)
    pack_folder(SAMPLE_DATA, root, fmt, spec, workers=1, options=SPLIT)
    manifest = json.loads((root / "manifest.json").read_text())
    part = root / manifest["shards"][1]["file"]
    part = part / "data.mdb" if part.is_dir() else part
    if fmt == "bmp":  # its parts are index files: damage one image file instead
        from readers.formats import open_reader

        part = Path(os.fsdecode(open_reader(root).index.path(25)))  # sample 25, in part 1
    data = bytearray(part.read_bytes())
    if damage == "truncated":
        os.truncate(part, len(data) // 2)
        return root
    if fmt == "bmp":
        data[:2] = b"XX"
    else:  # the second JPEG of the part: zero its first bytes after the SOI marker
        at = data.find(b"\xff\xd8\xff", data.find(b"\xff\xd8\xff") + 1)
        data[at + 2 : at + 300] = bytes(298)
    part.write_bytes(bytes(data))
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["corrupt-image", "truncated"])
@pytest.mark.parametrize("fmt", format_names())
def test_dali_loader_on_a_damaged_dataset_is_a_clear_error(tmp_path, fmt, damage):
    from readers.dali import dali_loader

    root = _damaged(tmp_path, fmt, damage)
    with pytest.raises(ImgpackError) as caught:
        for _ in dali_loader(root, batch_size=8, device="cpu", crop=32, shuffle=False):
            pass
    message = str(caught.value)
    assert str(root) in message and "\n" not in message, message
    if damage == "corrupt-image":  # the sample is named, not DALI's "Critical error in pipeline"
        assert re.search(r"sample 2\d", message), message


def test_remote_tar_through_dali_matches_local(s3, packed, tmp_path):
    import torch

    from readers.dali import dali_loader

    fs, options = s3
    local = packed("tar", options=SPLIT, **SMALL)
    url = _upload(s3, packed, "tar", "dali-tar")
    kwargs = dict(device="cpu", crop=32, seed=5)
    want = [(x.clone(), y.clone()) for x, y in dali_loader(local, batch_size=8, **kwargs)]
    for extra in ({}, {"cache_dir": str(tmp_path / "cache")}):
        reader_options = {"storage_options": options, **extra}
        got = list(dali_loader(url, batch_size=8, reader_options=reader_options, **kwargs))
        assert len(got) == len(want) == 6
        for (xa, ya), (xb, yb) in zip(got, want):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


@pytest.mark.timeout(60)
def test_killed_dali_py_worker_is_an_error_not_a_hang(packed):
    import psutil

    from readers.dali import dali_loader

    root = packed("lmdb", options=SPLIT, **SMALL)
    # Batches of one: far more batches than DALI prefetches, so the rest need the killed worker.
    before = {p.pid for p in psutil.Process().children()}  # other tests' servers are children too
    loader = dali_loader(root, batch_size=1, device="cpu", crop=32, py_workers=2, shuffle=False)
    batches = iter(loader)
    next(batches)
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) >= 2, workers
    os.kill(workers[0].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(
        ImgpackError, match=f"a DALI py_workers process \\(pid {workers[0].pid}\\) exited with code -9"
    ):
        for _ in batches:
            pass
    assert time.monotonic() - started < 10
    # the pool's other workers are gone too: one left blocked would hang this process's exit
    assert not [p for p in workers[1:] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    fresh = dali_loader(root, batch_size=4, device="cpu", crop=32, py_workers=2, shuffle=False)
    assert sum(len(y) for _, y in fresh) == 44  # a new loader reads again
