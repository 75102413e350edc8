"""What the view tests share (tests/readers/datasets/test_views.py,
tests/packer/edit/test_views_checks.py)."""

from __future__ import annotations

from pathlib import Path

from packer.edit.views import write_view
from packer.engine.pack_run import pack_folder
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA

FIXED = {"resize": 40, "crop": 32, "encode": "png"}
FORMAT_SPEC = {"bmp": {**FIXED, "encode": "bmp"}}
PICKED = [0, 1, 2, 3, 9, 10, 17, 18, 19, 25, 31, 40, 43]  # spans the three shards, with runs


def spec_of(fmt: str) -> dict:
    return FORMAT_SPEC.get(fmt, FIXED)


def view_of(parent: Path, out: Path, indices=PICKED) -> Path:
    write_view(parent, out, indices)
    return out


def fresh_parent(tmp_path: Path, fmt: str = "tar", seed: int = 0, force: bool = False) -> Path:
    out = tmp_path / "parent"
    spec = PreprocessSpec(**spec_of(fmt))
    pack_folder(SAMPLE_DATA, out, fmt, spec, workers=1, options={"shards": 3}, seed=seed, force=force)
    return out
