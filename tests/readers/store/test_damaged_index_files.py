"""A damaged TFRecord index or a shard replaced by a directory names the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from readers import open_iterable
from readers.errors import ManifestError
from tests.conftest import run_cli
from tests.support.cli import assert_one_line
from tests.support.damage import copy_of, read_all
from tests.support.formats import formats_with_index_files


# -- a damaged TFRecord index or a shard replaced by a directory names the file ---------------
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
