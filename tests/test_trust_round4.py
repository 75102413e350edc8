"""Issue 31 (trust, round 4): the cases a second probe of wave 3 still broke, one test each."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from readers import open_dataset
from readers.errors import DatasetReplacedError
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli


def _pack(out: Path, fmt: str, *extra) -> None:
    run_cli("imagefolder", SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--shards", "3",
            "--workers", "1", "-q", *extra, check=True)


# -- case 1: targets come from the data the reader opened -----------------------------------------
@pytest.mark.parametrize("fmt", format_names())
def test_targets_after_force_are_the_open_datasets_or_refused(tmp_path, fmt):
    out = tmp_path / "ds"
    _pack(out, fmt, "--seed", "0")
    shutil.copytree(out, tmp_path / "old")
    old = open_dataset(tmp_path / "old").targets
    reader = open_dataset(out, decode="numpy")
    assert reader[0][1] == old[0]  # the first part is open
    _pack(out, fmt, "--seed", "1", "--force")
    new = open_dataset(out).targets
    assert new != old  # the re-pack holds the samples in another order
    try:
        targets = reader.targets
    except DatasetReplacedError as exc:
        assert f"{out}: the dataset was replaced" in str(exc)
    else:
        assert targets == old
