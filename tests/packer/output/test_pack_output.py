"""The output directory: --force removes only imgpack's files, SRC is never an output, one pack at a
time (lock), a finished dataset is replaced atomically under open readers, files honour the umask."""

from __future__ import annotations

import json
import os
import stat

import pytest

from packer.engine.pack_run import pack_folder
from readers import open_dataset
from readers.errors import ManifestError
from readers.formats import format_names
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.formats import parts_hold_the_images
from tests.support.packrun import (
    SLOW_PACK,
    copy_source,
    dataset_arrays,
    kill_group,
    run_pack,
    start_pack,
    wait_started,
)

SMALL = PreprocessSpec(resize=32)


def test_force_refuses_a_folder_with_a_foreign_manifest(tmp_path):
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text(json.dumps({"name": "my app", "start_url": "/"}))
    (webapp / "src" / "index.js").write_text("console.log(1)")
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", webapp, "--force", "-q")
    assert proc.returncode == 1
    assert "not an imgpack output" in proc.stderr and "manifest.json" in proc.stderr and "src" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (webapp / "src" / "index.js").read_text() == "console.log(1)"
    assert json.loads((webapp / "manifest.json").read_text())["name"] == "my app"


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_output_equal_to_inside_or_around_the_source_is_refused(tmp_path, where):
    src = copy_source(tmp_path / "root" / "src")
    before = sorted(p for p in src.rglob("*"))
    out = {"same": src, "inside": src / "animals" / "packed", "parent": tmp_path / "root"}[where]
    proc = run_cli("imagefolder", src, "--to", "lmdb", "-o", out, "--force", "-q")
    assert proc.returncode == 1 and "source folder" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p for p in src.rglob("*")) == before


def test_two_packs_into_one_output_fail_fast(tmp_path):
    src = copy_source(tmp_path / "src", copies=2)
    out = tmp_path / "out"
    first = start_pack(src, "--to", "lmdb", "-o", out, "--workers", "1", "-q", *SLOW_PACK)
    try:
        wait_started(out, first)
        others = [
            start_pack(src, "--to", "lmdb", "-o", out, "-q", *SLOW_PACK, *flags)
            for flags in (["--force"], ["--resume"], [])
        ]
        tries = [(p.wait(timeout=60), "".join(p.communicate())) for p in others]
        assert first.poll() is None, "the first pack ended before the others tried"
    finally:
        kill_group(first.pid)
        first.wait()
    for rc, text in tries:  # 3 concurrent attempts, each refused before touching anything
        assert rc == 1 and "another pack is writing this output" in text, text


@pytest.mark.parametrize("fmt", format_names())
def test_force_under_an_open_reader_never_mixes_datasets(tmp_path, fmt):
    out = tmp_path / "ds"
    pack_folder(SAMPLE_DATA, out, fmt, SMALL, workers=1)
    old = dataset_arrays(out)
    held_open = parts_hold_the_images(out)  # else (BMP) each image is a file of its own
    reader = open_dataset(out, decode="numpy")
    reader[0]  # the reader has its files open
    rc, text = run_pack(SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--force", "-q")
    assert rc == 0, text
    seen = []
    try:
        for i in range(len(reader)):
            image, label = reader[i]
            seen.append((image.tobytes(), int(label)))
    except ManifestError as exc:  # old files gone: a clear error is fine, a mixture is not
        assert "open the dataset again" in str(exc)
    assert seen == old[: len(seen)]
    if held_open:
        assert len(seen) == len(old)  # an open part file keeps its old contents
    new = dataset_arrays(out)
    assert new and all(a != b for (a, _), (b, _) in zip(new, old))
    assert not any(p.name.endswith(".imgpack-new") for p in tmp_path.iterdir())


def test_manifest_and_progress_honour_the_umask(tmp_path):
    out = tmp_path / "ds"
    umask = os.umask(0o022)  # inherited by the pack
    try:
        proc = start_pack(SAMPLE_DATA, "--to", "lmdb", "-o", out, "--workers", "1", "-q", *SLOW_PACK)
    finally:
        os.umask(umask)
    try:
        wait_started(out, proc)
        progress_mode = stat.S_IMODE(os.stat(out / ".imgpack-progress.json").st_mode)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert progress_mode == 0o644
    assert stat.S_IMODE(os.stat(out / "manifest.json").st_mode) == 0o644


def test_a_killed_force_keeps_the_old_dataset_until_resume_swaps_the_new_one_in(tmp_path):
    out = tmp_path / "ds"
    pack_folder(SAMPLE_DATA, out, "hdf5", SMALL, workers=1)
    old = dataset_arrays(out)
    args = (SAMPLE_DATA, "--to", "hdf5", "-o", out, "--workers", "1", "-q", *SLOW_PACK)
    proc = start_pack(*args, "--force")
    wait_started(tmp_path / ".ds.imgpack-new", proc)
    kill_group(proc.pid)
    proc.wait()
    assert dataset_arrays(out) == old  # still the whole old dataset
    rc, text = run_pack(*args, "--resume")
    assert rc == 0, text
    assert open_dataset(out).manifest.preprocess["resize"] == 256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # staging folder gone
