"""The label file (readers/formats/label_file.py): tar and TFRecord keep every label in one
little-endian int64 file, checksummed by the manifest, instead of [label, count] runs in it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from packer.info.reindex import reindex
from packer.info.verify import verify_dataset
from readers.errors import ChecksumError, ImgpackError, ManifestError
from readers.formats import format_named, format_names, open_reader
from readers.formats.label_file import LABELS_NAME
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import MANIFEST_NAME, read_manifest
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.damage import edit_manifest
from tests.support.s3server import BUCKET

# The formats that own a label file: a new format that keeps one gets these tests.
WITH_LABEL_FILE = [name for name in format_names() if format_named(name).owns(LABELS_NAME)]
SPEC = {"resize": 24, "crop": 24}
SPLIT = {"samples_per_shard": 10}


def record_labels(root) -> list[int]:
    reader = open_reader(root)
    return [reader.read(i).label for i in range(len(reader))]


@pytest.fixture(params=WITH_LABEL_FILE)
def pack(request, packed, tmp_path) -> Path:
    """A private copy of a shuffled (the default order) pack of sample_data in shards of 10."""
    root = tmp_path / request.param
    shutil.copytree(packed(request.param, options=SPLIT, **SPEC), root)
    return root


@pytest.mark.parametrize("name", format_names())
def test_the_formats_that_store_labels_apart_are_found(packed, name):
    """The registry's answer agrees with what packing writes, so these tests run on every format
    that keeps a label file and on no other."""
    root = packed(name, options=SPLIT, **SPEC)
    assert (root / LABELS_NAME).exists() == (name in WITH_LABEL_FILE)
    assert WITH_LABEL_FILE


def test_labels_live_in_the_label_file_not_the_manifest(pack):
    manifest = json.loads((pack / MANIFEST_NAME).read_text())
    assert "label_runs" not in manifest["extra"]
    entry = manifest["extra"]["labels"]
    assert entry["file"] == LABELS_NAME and entry["bytes"] == 8 * 44
    on_disk = np.fromfile(pack / LABELS_NAME, dtype="<i8")
    assert on_disk.tolist() == record_labels(pack) == open_reader(pack).labels().tolist()
    assert len(set(np.diff(on_disk).tolist())) > 1  # a shuffled pack: the labels are not in runs
    assert verify_dataset(pack).ok


def test_an_older_pack_with_label_runs_still_reads(pack):
    labels = record_labels(pack)
    runs: list[list[int]] = []
    for label in labels:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])

    def old(manifest: dict) -> None:
        del manifest["extra"]["labels"]
        manifest["extra"]["label_runs"] = runs

    edit_manifest(pack, old)
    (pack / LABELS_NAME).unlink()
    assert open_reader(pack).labels().tolist() == labels
    assert open_reader(pack, verify=True).read_block(0, 44)[5].label == labels[5]
    assert verify_dataset(pack).ok


def test_an_edited_label_file_is_caught(pack):
    labels = open_reader(pack).labels()
    changed = labels.copy()
    changed[7] = (changed[7] + 1) % len(read_manifest(pack).classes)
    changed.astype("<i8").tofile(pack / LABELS_NAME)
    with pytest.raises(ChecksumError, match=f"{LABELS_NAME}: sha256 does not match the manifest"):
        open_reader(pack, verify=True).labels()
    report = verify_dataset(pack)
    assert not report.ok and LABELS_NAME in report.problems[0]
    from readers.store.checksums import file_sha256

    edit_manifest(pack, lambda m: m["extra"]["labels"].update(sha256=file_sha256(pack / LABELS_NAME)))
    with pytest.raises(ChecksumError, match=r"sample 7: label \d+ in the record but \d+ in the label file"):
        open_reader(pack, verify=True).read_block(0, 10)
    report = verify_dataset(pack)
    assert not report.ok and "sample 7" in report.problems[0]
    proc = run_cli("verify", pack)
    assert proc.returncode == 1 and "sample 7" in proc.stdout + proc.stderr


@pytest.mark.parametrize("damage", ["missing", "truncated", "directory"])
def test_a_missing_or_short_label_file_names_it(pack, damage):
    path = pack / LABELS_NAME
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-8])
    else:
        path.unlink()
        if damage == "directory":
            path.mkdir()
    with pytest.raises(ImgpackError, match=str(path)):
        open_reader(pack).labels()
    assert LABELS_NAME in verify_dataset(pack).problems[0]
    proc = run_cli("info", pack)  # info shows the order's class mix: from the labels
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [f"Error: {path}: " + (
        f"label file listed in the manifest is missing; copy it again, or rebuild it with `pack reindex "
        f"{pack}`" if damage == "missing" else
        "is a directory or special file, not the data file the manifest lists; copy that file again or "
        "re-pack the dataset" if damage == "directory" else
        "sha256 does not match the manifest (344 bytes, the manifest says 352) (corrupt or modified); "
        "copy it again or re-pack the dataset")]  # fmt: skip


def test_a_label_entry_that_does_not_count_the_samples_is_refused(pack):
    edit_manifest(pack, lambda m: m["extra"]["labels"].update(bytes=8))
    with pytest.raises(ManifestError, match="extra.labels' says 8 bytes, not 8 for each of 44"):
        open_reader(pack).labels()


def test_reindex_restores_the_label_file_and_force_removes_it(pack, tmp_path):
    labels = open_reader(pack).labels().tolist()
    want = (pack / LABELS_NAME).read_bytes()
    for idx in pack.glob("*.idx"):
        idx.unlink()
    assert str(pack / LABELS_NAME) not in reindex(pack)  # whole: left as it is
    assert open_reader(pack).labels().tolist() == labels and verify_dataset(pack).ok
    (pack / LABELS_NAME).unlink()
    proc = run_cli("reindex", pack)
    assert proc.returncode == 0 and (pack / LABELS_NAME).read_bytes() == want, proc.stderr
    (pack / LABELS_NAME).write_bytes(bytes(len(want)))  # damaged: every label 0
    assert str(pack / LABELS_NAME) in reindex(pack) and (pack / LABELS_NAME).read_bytes() == want
    edit_manifest(pack, lambda m: m["extra"]["labels"].update(sha256="0" * 64))  # shards disagree
    with pytest.raises(ImgpackError, match=f"{LABELS_NAME}: the shards' labels are not those"):
        reindex(pack)
    pack_folder(SAMPLE_DATA, pack, "lmdb", PreprocessSpec(**SPEC), workers=1, force=True)
    assert not (pack / LABELS_NAME).exists()  # the format's own file: --force may delete it


def test_a_resumed_pack_writes_the_same_label_file(tmp_path):
    """(Ray packs: formats/tar/test_tar.py compares every file of a Ray pack, labels.i64 included.)"""
    fmt = WITH_LABEL_FILE[0]
    spec = PreprocessSpec(**SPEC)
    whole = tmp_path / "whole"
    pack_folder(SAMPLE_DATA, whole, fmt, spec, workers=2, options=SPLIT)
    cut = tmp_path / "cut"
    pack_folder(SAMPLE_DATA, cut, fmt, spec, workers=2, options=SPLIT)
    (cut / MANIFEST_NAME).unlink()  # as if killed before the end: the parts are done, the file gone
    (cut / LABELS_NAME).unlink()
    pack_folder(SAMPLE_DATA, cut, fmt, spec, workers=1, options=SPLIT, resume=True)
    assert (cut / LABELS_NAME).read_bytes() == (whole / LABELS_NAME).read_bytes()


@pytest.mark.parametrize("fmt", WITH_LABEL_FILE)
def test_remote_packs_and_reads_use_the_label_file(s3, packed, tmp_path, fmt):
    fs, options = s3
    local = packed(fmt, options=SPLIT, **SPEC)
    out = f"s3://{BUCKET}/labels-{fmt}"
    spec = PreprocessSpec(**SPEC)
    pack_folder(SAMPLE_DATA, out, fmt, spec, workers=1, options=SPLIT, storage_options=options)
    stored = fs.cat_file(f"{BUCKET}/labels-{fmt}/{LABELS_NAME}")
    assert stored == (local / LABELS_NAME).read_bytes()
    remote = open_reader(out, storage_options=options, verify=True)
    assert remote.labels().tolist() == open_reader(local).labels().tolist()
    assert verify_dataset(out, storage_options=options, cache_dir=tmp_path / "cache").ok
    fs.pipe_file(f"{BUCKET}/labels-{fmt}/{LABELS_NAME}", stored[:-8])
    with pytest.raises(ChecksumError, match=f"{out}/{LABELS_NAME}: sha256 does not match"):
        open_reader(out, storage_options=options).labels()
