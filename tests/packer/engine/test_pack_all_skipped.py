"""A pack that skipped every image leaves nothing half-made, locally and on S3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from readers import open_dataset
from readers.formats import format_names
from tests.conftest import run_cli
from tests.support.cli import assert_one_line
from tests.support.damage import SMALL, SPLIT


# -- a pack that skipped every image leaves nothing half-made ----------------------------------
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
