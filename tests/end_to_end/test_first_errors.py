"""The mistakes of a new user's first hour: each is refused or reported, naming the fix.

Every test works from the user's side: the ``pack`` CLI as a subprocess, or the public ``readers``
API with real DataLoader workers. sample_data's smallest image is 200 px on its shorter side.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from readers import ImgpackError, open_dataset, open_iterable
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.cli import assert_one_line, pack_sample

SMALLER_THAN_250 = 8  # sample_data images with a side under 250 px


# -- packing ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crop250(tmp_path_factory) -> tuple[Path, str]:
    """sample_data packed with --crop 250 and no --upscale, and what the CLI printed."""
    out = tmp_path_factory.mktemp("crop250") / "ds"
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--crop", "250", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_crop_without_upscale_skips_small_images_naming_upscale(crop250):
    out, summary = crop250
    manifest = json.loads((out / "manifest.json").read_text())
    reasons = [s["reason"] for s in manifest["skipped"]]
    assert len(reasons) == SMALLER_THAN_250 and manifest["num_samples"] == 44 - SMALLER_THAN_250
    assert all("--crop 250" in r and "--upscale" in r for r in reasons)
    assert manifest["stored_sizes"]["upscaled"] == 0
    assert f"skipped {SMALLER_THAN_250}" in summary and "upscaled" not in summary


def test_crop_with_upscale_enlarges_and_says_how_many(tmp_path):
    out = tmp_path / "up"
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--crop", "250", "--upscale")
    assert proc.returncode == 0, proc.stderr
    assert f"upscaled {SMALLER_THAN_250}" in proc.stdout
    info = run_cli("info", out, check=True).stdout
    assert f"upscaled  {SMALLER_THAN_250} image(s)" in info and "skipped   0" in info


def test_crop_larger_than_resize_is_an_error(tmp_path):
    out = tmp_path / "o"
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32", "--crop", "64")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--crop 64 is larger than --resize 32" in proc.stderr and "--crop 32 or less" in proc.stderr
    assert not (out / "manifest.json").exists()


def test_info_shows_stored_size_range_upscaled_and_skip_reasons_by_count(crop250, tmp_path):
    out, _ = crop250
    info = run_cli("info", out, check=True).stdout
    assert "stored    height 250-250 px, width 250-250 px" in info
    assert "upscaled  0 image(s)" in info
    assert f"{SMALLER_THAN_250} x smaller than --crop 250" in info  # one line per reason, with its count
    as_json = json.loads(run_cli("info", out, "--json", check=True).stdout)
    assert as_json["stored_sizes"] == {
        "count": 44 - SMALLER_THAN_250,
        "upscaled": 0,
        "min_height": 250,
        "max_height": 250,
        "min_width": 250,
        "max_width": 250,
    }
    varied = tmp_path / "varied"
    run_cli("imagefolder", SAMPLE_DATA, "--to", "tar", "-o", varied, "--resize", "64", "-q", check=True)
    sizes = json.loads((varied / "manifest.json").read_text())["stored_sizes"]
    assert sizes["min_height"] == sizes["min_width"] == 64 < sizes["max_width"]


def test_manifest_without_size_range_still_loads(crop250, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(crop250[0], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["stored_sizes"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    info = run_cli("info", old)
    assert info.returncode == 0 and "size range not recorded" in info.stdout
    images, _ = next(iter(open_iterable(old, batch_size=4)))
    assert images.shape == (4, 3, 250, 250)


def test_packed_dataset_as_source_says_so(crop250, tmp_path):
    proc = run_cli("imagefolder", crop250[0], "--to", "tar", "-o", tmp_path / "o")
    assert proc.returncode == 1 and "this is an imgpack dataset" in proc.stderr
    assert "pack the original image folder" in proc.stderr


def test_image_folder_opened_as_dataset_says_pack_it():
    proc = run_cli("info", SAMPLE_DATA)
    assert proc.returncode == 1 and "--resume" not in proc.stderr
    assert "not a packed dataset" in proc.stderr and "pack imagefolder" in proc.stderr
    with pytest.raises(ImgpackError, match="not a packed dataset .pack it with `pack imagefolder"):
        open_dataset(SAMPLE_DATA)


def test_interrupted_pack_still_suggests_resume(tmp_path):
    (tmp_path / ".imgpack-progress.json").write_text("{}")
    proc = run_cli("info", tmp_path)
    assert proc.returncode == 1 and "--resume" in proc.stderr


def test_every_file_failing_names_the_first_reason(tmp_path):
    src = tmp_path / "src" / "cats"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"not a jpeg")
    (src / "b.jpg").write_bytes(b"")
    proc = run_cli("imagefolder", tmp_path / "src", "--to", "lmdb", "-o", tmp_path / "o", "-q")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        "every image was skipped (2), so no dataset was written; first reason: cats/a.jpg: not an image"
        in proc.stderr
    )


# -- reading ------------------------------------------------------------------------------------


def test_crop_larger_than_stored_images_fails_when_the_iterable_is_created(packed):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    with pytest.raises(ImgpackError, match=r"crop=48 is larger than the smallest stored .*pass resize="):
        open_iterable(path, batch_size=4, crop=48)
    with pytest.raises(ImgpackError, match=r"crop=\(20, 30\) is larger than resize=\(24, 24\)"):
        open_iterable(path, batch_size=4, resize=(24, 24), crop=(20, 30))
    with pytest.raises(ImgpackError, match="crop=40 is larger than resize=24"):
        open_iterable(path, batch_size=4, resize=24, crop=40)
    images, _ = next(iter(open_iterable(path, batch_size=4, resize=48, crop=48)))  # the named fix works
    assert images.shape == (4, 3, 48, 48)


def test_varied_stored_sizes_without_crop_fail_when_the_iterable_is_created(packed):
    path = packed("lmdb", resize=40, encode="jpeg")  # shorter side 40, the other side varies
    with pytest.raises(ImgpackError, match="a batch needs images of one size.*pass crop="):
        open_iterable(path, batch_size=4)
    images, _ = next(iter(open_iterable(path, batch_size=4, crop=40)))
    assert images.shape == (4, 3, 40, 40)


def test_transform_with_batch_size_names_batch_transform(packed):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    with pytest.raises(ValueError, match="batch_transform="):
        open_iterable(path, batch_size=4, transform=lambda image: image)
    with pytest.raises(ValueError, match="also pass batch_size="):
        open_iterable(path, batch_transform=lambda images: images)
    seen = []

    def halve(images):
        seen.append(tuple(images.shape))
        return images // 2

    plain = open_iterable(path, batch_size=4, shuffle=False)
    halved = open_iterable(path, batch_size=4, shuffle=False, batch_transform=halve)
    for (a, la), (b, lb) in zip(DataLoader(plain, batch_size=None), DataLoader(halved, batch_size=None)):
        assert torch.equal(a // 2, b) and torch.equal(la, lb)
    assert seen and set(seen) <= {(4, 3, 32, 32)}
    per_image = open_iterable(path, shuffle=False, transform=lambda image: image.shape)
    assert next(iter(per_image))[0] == (3, 32, 32)  # without batch_size, transform= is per image


# -- more first mistakes: a missing --workdir, an epoch beyond range, --resume with nothing to resume
def test_a_missing_workdir_is_one_line_for_webdataset_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pack_sample(tmp_path / "shards", "tar")
    table = tmp_path / "t.parquet"
    image = (SAMPLE_DATA / "animals").iterdir().__next__().read_bytes()
    pq.write_table(pa.table({"image": [{"bytes": image, "path": None}], "label": ["a"]}), table)
    missing = tmp_path / "no" / "such"
    for source in (["webdataset", tmp_path / "shards" / "shard-000000.tar"], ["parquet", table]):
        proc = run_cli(*source, "--workdir", missing, "--to", "lmdb", "-o", tmp_path / "o", "-q")
        assert_one_line(proc, f"{missing}: --workdir is not an existing folder")
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("epoch", [2**64, -1, 2**32, 1.5])
def test_set_epoch_out_of_range_is_a_clear_error(packed, epoch):
    from readers import make_loader, open_iterable
    from readers.datasets.dataset import DeterministicSampler
    from readers.errors import OptionError

    stream = open_iterable(packed("lmdb"), batch_size=4, crop=24)
    loader = make_loader(open_iterable(packed("lmdb"), batch_size=4, crop=24), num_workers=0)
    for target in (stream, loader, DeterministicSampler(10)):
        with pytest.raises(OptionError, match=r"set_epoch\(.*\): the epoch must be"):
            target.set_epoch(epoch)
    stream.set_epoch(2**32 - 1)  # the last epoch the order tells apart


# -- --resume with nothing to resume says so; --resume --force is refused ---------------
def test_resume_with_nothing_to_resume_says_so_and_resume_force_is_refused(tmp_path):
    out = tmp_path / "ds"
    args = ["imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "24", "--workers", "1", "-q"]
    proc = run_cli(*args, "--resume", check=True)
    assert f"{out}: nothing to resume (no interrupted pack there); packing from the start" in proc.stderr
    assert open_dataset(out).targets  # and it packed
    assert_one_line(run_cli(*args, "--resume", "--force"), f"{out}: --force (start over) and --resume")
    assert_one_line(run_cli(*args, "--resume"), f"{out}: already complete")
