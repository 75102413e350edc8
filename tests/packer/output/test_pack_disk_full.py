"""A full disk while packing: a real 20 MB tmpfs per test, and ENOSPC injected (strace) into the
progress and manifest writes. Each ends in one clear line, no crash, and nothing left filling the disk."""

from __future__ import annotations

import shutil

import pytest

from packer.info.verify import verify_dataset
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.disks import mounted_tmpfs
from tests.support.packrun import copy_source, run_pack, syscall_count

pytestmark = pytest.mark.root  # mounts a 20 MB tmpfs


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs mounted for the test (and unmounted after it)."""
    with mounted_tmpfs(tmp_path / "disk", "20m") as mount:
        yield mount


def assert_one_line_error(rc: int, text: str, *words: str) -> None:
    assert rc == 1, f"rc {rc} (139 would be a segfault): {text}"
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in text, text
    for word in words:
        assert word.lower() in lines[0].lower(), text


@pytest.mark.parametrize("fmt", format_names())
def test_disk_full_is_one_clear_error_and_frees_the_disk(tmp_path, small_disk, fmt):
    src = copy_source(tmp_path / "src", copies=2)  # ~27 MB of raw 320x320 pixels: does not fit
    out = small_disk / "ds"
    args = [
        "--to",
        fmt,
        "-o",
        out,
        "--resize",
        "320",
        "--crop",
        "320",
        "--upscale",  # without it the smaller sample photos are skipped, not enlarged
        "--encode",
        "raw",
        "--workers",
        "2",
        "-q",
    ]
    rc, text = run_pack(src, *args)
    assert_one_line_error(rc, text, "No space left on device", "free some space")
    assert shutil.disk_usage(small_disk).used < 1 << 20  # the partial part was removed
    assert sorted(p.name for p in out.iterdir()) == [".imgpack-progress.json"]  # no staging folder left


@pytest.mark.parametrize("which", ["progress file", "manifest"])
def test_enospc_on_the_progress_or_manifest_write_is_one_line_and_resumable(tmp_path, which):
    args = [SAMPLE_DATA, "--to", "tar", "-o", tmp_path / "ds", "--resize", "32", "--workers", "1", "-q"]
    total = syscall_count("fsync", *args[:4], tmp_path / "count", *args[5:])
    # write_atomic fsyncs the file, then its folder: the progress file is the first, the manifest
    # the last but one.
    when = 1 if which == "progress file" else total - 1
    inject = ["-e", "trace=fsync", "-e", f"inject=fsync:error=ENOSPC:when={when}"]
    rc, text = run_pack(*args, strace=inject)
    assert_one_line_error(rc, text, f"cannot write the {which}", "No space left on device", "--resume")
    rc, text = run_pack(*args, "--resume")
    assert rc == 0, text
    assert verify_dataset(tmp_path / "ds").ok


# -- a full disk is one line for every format, small buffered writes included -------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB tmpfs, mounted for the test (root only, as in CI) and unmounted after it."""
    with mounted_tmpfs(tmp_path / "tiny-disk", "256k") as mount:
        yield mount


@pytest.mark.root
@pytest.mark.parametrize("fmt", format_names())
def test_a_full_disk_under_small_samples_is_one_line(tmp_path, tiny_disk, fmt):
    # small JPEGs sit in the file's write buffer when the disk fills: closing it must not raise again
    src = copy_source(tmp_path / "src", copies=4)
    proc = run_cli(
        "imagefolder", src, "--to", fmt, "-o", tiny_disk / "ds", "--resize", "64", "--workers", "1", "-q"
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        len(lines) == 1 and lines[0].startswith("Error: ") and "no space left on device" in lines[0].lower()
    ), lines
