"""`pack info` and `pack verify` on damaged datasets: broken parts are named (exit 1), the verify
summary counts what the manifest lists, an image file is said to be a file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from packer.info.verify import verify_dataset
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.cli import assert_one_line
from tests.support.damage import copy_of


# -- pack info sees broken parts; pack verify's summary and hints ------------------------------
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


# -- pack info exits 1 naming a damaged part, for every format ----------------------------
def _missing(part: Path) -> None:
    part.unlink()


def _truncated(part: Path) -> None:
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])


def _directory(part: Path) -> None:
    part.unlink()
    part.mkdir()


def _dev_zero(part: Path) -> None:
    part.unlink()
    part.symlink_to("/dev/zero")


@pytest.mark.parametrize("fmt", format_names())
def test_pack_info_names_a_damaged_part(packed, tmp_path, fmt):
    from readers.formats import open_reader

    for damage in (_missing, _truncated, _directory, _dev_zero):
        root = tmp_path / damage.__name__
        shutil.copytree(packed(fmt), root)
        reader = open_reader(root)
        part = Path(reader.checksum_path(reader.manifest.shards[-1]))
        reader.close()
        damage(part)
        assert_one_line(run_cli("info", root), str(part))
