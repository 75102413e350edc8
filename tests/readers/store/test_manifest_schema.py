"""The manifest is checked against its schema before anything reads it: malformed fields, unbounded
integers, HDF5 datasets of the wrong dtype or shape, and old format versions are named."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest

from readers import open_dataset, open_iterable
from readers.errors import ManifestError
from readers.formats import open_reader
from tests.conftest import run_cli
from tests.support.cli import assert_one_line
from tests.support.damage import assert_verify_fails, copy_of, edit_manifest

# -- the manifest is checked against its schema before anything reads it ------------------------
SCHEMA_CASES = {
    "num_samples float": (lambda m: m.update(num_samples=44.0), "num_samples"),
    "num_samples string": (lambda m: m.update(num_samples="44"), "num_samples"),
    "classes null": (lambda m: m.update(classes=None), "classes"),
    "classes of numbers": (lambda m: m.update(classes=[1, 2]), "classes"),
    "negative count": (lambda m: m["shards"][2].update(count=-5), "shards[2].count"),
    "huge count": (lambda m: m["shards"][2].update(count=10**15, bytes=10**16), "shards[2].count"),
    "huge total": (
        lambda m: (m["shards"][2].update(count=10**12, bytes=10**16), m.update(num_samples=10**12 + 40)),
        "the manifest says",  # in range for the schema; the part itself holds far fewer
    ),
    "counts do not sum": (lambda m: m.update(num_samples=40), "num_samples"),
    "gap between shards": (lambda m: m["shards"][1].update(first=21), "shards[1].first"),
    "sha256 missing": (lambda m: m["shards"][0].update(sha256=""), "shards[0].sha256"),
    "format_version string": (lambda m: m.update(format_version="2"), "format_version"),
    "shards not a list": (lambda m: m.update(shards={"file": "x"}), "shards"),
    "preprocess missing": (lambda m: m.pop("preprocess"), "preprocess"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_malformed_manifest_field_is_named(packed, tmp_path, case):
    change, field = SCHEMA_CASES[case]
    root = copy_of(packed, "lmdb", tmp_path)
    edit_manifest(root, change)
    with pytest.raises(ManifestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        open_iterable(root, batch_size=8)


def test_malformed_manifest_is_one_line_from_the_cli(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    edit_manifest(root, lambda m: m.update(classes=None))
    assert_verify_fails(root, "field 'classes'", cli=True)
    proc = run_cli("info", root)
    assert proc.returncode != 0 and "classes" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("name", "replacement", "needle"),
    [
        ("labels", np.zeros(20, np.float32), "'labels' is float32"),
        ("shapes", np.zeros((20, 2), np.int32), "'shapes' is int32 (20, 2)"),
        ("images", np.zeros(100, np.int16), "'images' is int16"),
    ],
)
def test_hdf5_dataset_of_the_wrong_dtype_or_shape_is_refused(packed, tmp_path, name, replacement, needle):
    root = copy_of(packed, "hdf5", tmp_path)
    with h5py.File(root / "data-000000.h5", "r+") as fh:
        del fh[name]
        fh[name] = replacement
    with pytest.raises(ManifestError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        open_reader(root)


def test_datasets_of_format_version_1_ask_for_a_repack(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    edit_manifest(root, lambda m: m.update(format_version=1))
    with pytest.raises(ManifestError, match="format_version 1.*re-pack it with this version"):
        open_reader(root)
    tar = copy_of(packed, "tar", tmp_path)
    label = open_reader(tar).read(0).label
    edit_manifest(tar, lambda m: m.update(format_version=1))
    assert open_reader(tar).read(0).label == label  # tar's layout did not change


# -- manifest integers and HDF5 shapes are bounded, the field named ---------------------------
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
