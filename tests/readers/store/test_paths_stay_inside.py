"""Paths stay inside: manifest and index entries, symlinked parts and BMP files that leave the dataset
are refused on reading, and symlinks under --root that point outside are skipped when packing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from packer.sources.imagelist import scan_list
from readers import open_dataset, read_manifest
from readers.errors import ManifestError
from readers.formats import format_names, open_reader
from tests.conftest import run_cli
from tests.support.cli import write_images
from tests.support.damage import assert_verify_fails, copy_of, edit_manifest, reseal


# -- paths from the manifest or an index stay inside the dataset --------------------------------
@pytest.mark.parametrize("entry", ["../../etc/passwd", "/etc/passwd", "data/../../x", "C:\\x"])
@pytest.mark.parametrize("fmt", format_names())
def test_manifest_shard_path_outside_the_dataset_is_refused(packed, tmp_path, fmt, entry):
    root = copy_of(packed, fmt, tmp_path)
    edit_manifest(root, lambda m: m["shards"][0].update(file=entry))
    with pytest.raises(ManifestError, match="shard file .* not a relative path inside the dataset"):
        open_reader(root)
    assert_verify_fails(root, "not a relative path inside", cli=entry == "/etc/passwd")


@pytest.mark.parametrize("fmt", format_names())
def test_symlinked_part_leaving_the_dataset_is_refused(packed, tmp_path, fmt):
    root = copy_of(packed, fmt, tmp_path)
    name = open_reader(root).manifest.shards[0].file
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    shutil.move(root / name, outside)  # identical bytes, but not inside the dataset any more
    os.symlink(outside, root / name)
    with pytest.raises(ManifestError, match="outside the dataset directory"):
        open_reader(root).read(0)
    assert_verify_fails(root, "outside the dataset directory")


def test_bmp_index_row_outside_the_dataset_is_refused(packed, tmp_path):
    root = copy_of(packed, "bmp", tmp_path)
    index = root / "files-000000.jsonl"
    lines = index.read_text().splitlines()
    row = json.loads(lines[1])
    row[0] = "../../../etc/passwd"
    index.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    reseal(root, 0, index)
    with pytest.raises(ManifestError, match=r"files-000000.jsonl: file '\.\./\.\./\.\./etc/passwd'"):
        open_dataset(root, decode="bytes")[0]
    assert_verify_fails(root, "etc/passwd")


def test_bmp_file_symlinked_out_of_the_dataset_is_refused(packed, tmp_path):
    root = copy_of(packed, "bmp", tmp_path)
    reader = open_reader(root)
    label = reader.read(0).label
    first = Path(os.fsdecode(reader.index.path(0)))
    outside = tmp_path / "outside.bmp"
    shutil.copy(first, outside)
    first.unlink()
    first.symlink_to(outside)
    with pytest.raises(ManifestError, match="outside the dataset directory"):
        open_reader(root).read(0)
    (first.parent / "inside.bmp").write_bytes(outside.read_bytes())
    first.unlink()
    first.symlink_to("inside.bmp")  # a link that stays inside is fine
    assert open_reader(root, verify=True).read(0).label == label


# -- symlinks under --root that leave it ------------------------------------------------


def test_symlinks_under_root_that_point_outside_are_skipped(tmp_path):
    root = write_images(tmp_path / "root", ["in.png"])
    outside = write_images(tmp_path / "secret", ["s.png"])
    os.symlink(outside / "s.png", root / "file_link.png")
    os.symlink(outside, root / "dir_link")
    os.symlink(root / "in.png", root / "inner_link.png")  # a link that stays inside is fine
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\nin.png,a\nfile_link.png,a\ndir_link/s.png,a\ninner_link.png,a\n")
    scan = scan_list(listing, root)
    assert [i.rel for i in scan.items] == ["in.png", "inner_link.png"]
    assert [s["reason"] for s in scan.skipped] == [
        f"l.csv line 3: outside --root {root} (a symlink to {outside / 's.png'})",
        f"l.csv line 4: outside --root {root} (a symlink to {outside / 's.png'})",
    ]
    out = tmp_path / "out"
    proc = run_cli("imagelist", listing, "--root", root, "--to", "tar", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 2
