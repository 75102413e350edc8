"""Reading hostile or damaged datasets: paths stay inside, manifests are schema-checked, checksums
cover labels, truncated LMDB never maps past its end, and every read error names its sample."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from packer.verify import verify_dataset
from readers import open_dataset, open_iterable
from readers.checksums import file_sha256
from readers.errors import ChecksumError, DecodeError, ManifestError
from readers.formats import format_names, open_reader
from readers.record import ENCODING_CODES, HEADER
from tests.conftest import cli_env, run_cli
from tests.helpers_damage import edit_manifest

SPLIT = {"samples_per_shard": 20}  # 44 samples: shards of 20, 20, 4


def copy_of(packed, fmt: str, tmp_path: Path) -> Path:
    root = tmp_path / fmt
    shutil.copytree(packed(fmt, options=SPLIT, resize=32, crop=32), root, symlinks=True)
    return root


def reseal(root: Path, shard: int, data_file: Path) -> None:
    """Record ``data_file``'s new sha256 in the manifest, as a careful hand-editor would."""
    edit_manifest(root, lambda m: m["shards"][shard].update(sha256=file_sha256(data_file)))


def assert_verify_fails(root: Path, *needles: str, cli: bool = False) -> None:
    """``pack verify`` (in process, or as the real CLI) reports a problem mentioning ``needles``."""
    if cli:
        proc = run_cli("verify", root)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and ": OK" not in proc.stdout
        text = proc.stderr + proc.stdout
    else:
        report = verify_dataset(root)
        assert not report.ok
        text = "\n".join(report.problems)
    for needle in needles:
        assert needle in text, text


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


# -- the per-record checksum covers the label ---------------------------------------------------
def _record_of(root: Path, index: int):
    reader = open_reader(root)
    try:
        return reader.read(index)
    finally:
        reader.close()


def _edit_lmdb_label(root: Path, index: int, new: int) -> Path:
    old = _record_of(root, index)
    data_file = root / "data-000000.lmdb" / "data.mdb"
    blob = bytearray(data_file.read_bytes())
    # The record is found by its header fields followed by its first image bytes.
    code = ENCODING_CODES[old.encoding]
    needle = HEADER.pack(old.label, code, old.channels, 0, old.height, old.width, 0)[:-4]
    at = blob.find(needle)
    image = bytes(old.data)
    while at >= 0 and bytes(blob[at + HEADER.size : at + HEADER.size + len(image)]) != image:
        at = blob.find(needle, at + 1)
    assert at >= 0
    struct.pack_into("<i", blob, at, new)
    data_file.write_bytes(bytes(blob))
    return data_file


def _edit_hdf5_label(root: Path, index: int, new: int) -> Path:
    data_file = root / "data-000000.h5"
    with h5py.File(data_file, "r+") as fh:
        fh["labels"][index] = new
    return data_file


def _edit_bmp_label(root: Path, index: int, new: int) -> Path:
    data_file = root / "files-000000.jsonl"
    lines = data_file.read_text().splitlines()
    row = json.loads(lines[1 + index])
    row[1] = new
    lines[1 + index] = json.dumps(row)
    data_file.write_text("\n".join(lines) + "\n")
    return data_file


def _edit_tar_label(root: Path, index: int, new: int) -> Path:
    """The label in the sample's ``.json`` member (what the reader reads), same length."""
    old = _record_of(root, index).label
    data_file = root / "shard-000000.tar"
    shard_index = open_reader(root).handle(0).index
    at, size = int(shard_index.json_offset[index]), int(shard_index.json_size[index])
    blob = bytearray(data_file.read_bytes())
    member = bytes(blob[at : at + size]).replace(b'"label":%d' % old, b'"label":%d' % new)
    assert len(member) == size and member != bytes(blob[at : at + size])
    blob[at : at + size] = member
    data_file.write_bytes(bytes(blob))
    return data_file


def _edit_tfrecord_label(root: Path, index: int, new: int) -> Path:
    """The label in the record's ``imgpack/meta`` feature, its CRC32C recomputed (a careful editor)."""
    from readers.checksums import masked_crc
    from readers.formats.tfrecord.example import varint

    old = _record_of(root, index)
    data_file = root / "shard-000000.tfrecord"
    handle = open_reader(root).handle(0)
    offsets, sizes = handle.offsets, handle.sizes
    at, size = int(offsets[index]), int(sizes[index])
    blob = bytearray(data_file.read_bytes())
    payload = bytearray(blob[at + 12 : at + size - 4])
    meta = b"".join(varint(v) for v in (old.label, old.height, old.width, old.channels))
    where = payload.find(meta)
    assert where >= 0 and len(varint(new)) == len(varint(old.label))
    payload[where : where + len(varint(new))] = varint(new)
    blob[at + 12 : at + size - 4] = payload
    struct.pack_into("<I", blob, at + size - 4, masked_crc(bytes(payload)))
    data_file.write_bytes(bytes(blob))
    return data_file


# How to change sample ``index``'s stored label in place, per format (returns the file changed).
# A registered format without an entry fails the test below: add its edit here.
LABEL_EDITS = {
    "lmdb": _edit_lmdb_label,
    "hdf5": _edit_hdf5_label,
    "bmp": _edit_bmp_label,
    "tar": _edit_tar_label,
    "tfrecord": _edit_tfrecord_label,
}


@pytest.mark.parametrize("fmt", format_names())
def test_edited_label_is_caught_by_verify(packed, tmp_path, fmt):
    if fmt not in LABEL_EDITS:
        pytest.fail(f"format {fmt!r} has no entry in LABEL_EDITS: add how to edit one of its labels")
    root = copy_of(packed, fmt, tmp_path)
    before = open_reader(root).read(3).label
    new = (before + 1) % len(open_reader(root).manifest.classes)
    data_file = LABEL_EDITS[fmt](root, 3, new)
    assert open_reader(root).read(3).label == new  # without verify nothing is checked
    with pytest.raises(ChecksumError, match="sha256"):
        open_reader(root, verify=True).read(3)
    assert_verify_fails(root, data_file.name)
    # Even with the manifest's sha256 updated, the record's CRC32 (or, where the format keeps the
    # labels apart too, the label file) catches it.
    reseal(root, 0, data_file)
    with pytest.raises(ChecksumError, match=r"sample 3\b.*checksum"):
        open_reader(root, verify=True).read(3)
    assert_verify_fails(root, "sample 3")


def test_datasets_of_format_version_1_ask_for_a_repack(packed, tmp_path):
    root = copy_of(packed, "lmdb", tmp_path)
    edit_manifest(root, lambda m: m.update(format_version=1))
    with pytest.raises(ManifestError, match="format_version 1.*re-pack it with this version"):
        open_reader(root)
    tar = copy_of(packed, "tar", tmp_path)
    label = open_reader(tar).read(0).label
    edit_manifest(tar, lambda m: m.update(format_version=1))
    assert open_reader(tar).read(0).label == label  # tar's layout did not change


# -- a truncated LMDB file is refused before it is mapped (no SIGBUS) ---------------------------
READ_SCRIPT = """
import sys
from readers import open_dataset
from readers.errors import ImgpackError
for root in sys.argv[1:]:
    for verify, cache in ((False, None), (True, None), (True, "ram")):
        try:
            ds = open_dataset(root, decode="numpy", verify=verify, cache=cache)
            for i in range(len(ds)):
                ds[i]
            print("read everything", verify, cache)
        except ImgpackError as exc:
            print(type(exc).__name__, exc)
"""


def test_truncated_lmdb_is_an_error_not_sigbus(packed, tmp_path):
    roots = []
    for reseal_it in (False, True):
        root = tmp_path / f"ds-{reseal_it}"
        shutil.copytree(packed("lmdb", resize=32, crop=32), root)
        data = root / "data-000000.lmdb" / "data.mdb"
        os.truncate(data, data.stat().st_size // 2)
        if reseal_it:  # the manifest agrees with the short file: LMDB's own header still says more
            entry = {"bytes": data.stat().st_size, "sha256": file_sha256(data)}
            edit_manifest(root, lambda m, entry=entry: m["shards"][0].update(entry))
        roots.append(str(root))
    # One process reads both copies three ways (plain, verify=True, cache="ram"): a SIGBUS kills it.
    args = [sys.executable, "-c", READ_SCRIPT, *roots]
    proc = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("ManifestError") and "data.mdb" in line for line in lines)
    assert "holds" in lines[0] and "truncated, LMDB needs" in lines[3]
    assert_verify_fails(Path(roots[1]), "truncated, LMDB needs", cli=True)


# -- every read error names the dataset, the part and the sample --------------------------------
def test_corrupt_jpeg_in_a_tar_shard_names_its_sample(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    reader = open_reader(root)
    index = reader.handle(1).index
    start = int(index.image_offset[3])
    shard = root / "shard-000001.tar"
    with open(shard, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\0" * 64)  # the JPEG markers are gone
    pattern = r"shard-000001.tar, sample 23: jpeg image bytes do not decode"
    with pytest.raises(DecodeError, match=pattern):
        open_dataset(root, decode="numpy")[23]
    it = open_iterable(root, shuffle=False, block_size=10)
    with pytest.raises(DecodeError, match=pattern):
        list(it)
    it = open_iterable(root, shuffle=False, batch_size=8, resize=32)
    with pytest.raises(DecodeError, match=pattern):
        list(it)
    assert_verify_fails(root, "shard-000001.tar")


def test_broken_bmp_names_its_file_and_sample(packed, tmp_path):
    root = copy_of(packed, "bmp", tmp_path)
    path = Path(os.fsdecode(open_reader(root).index.path(5)))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DecodeError, match=rf"sample 5 \(.*{path.name}\): bmp image bytes do not decode"):
        open_dataset(root, decode="numpy")[5]
    assert_verify_fails(root, path.name)


def test_reindex_of_a_truncated_tar_is_one_line(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    shard = root / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    proc = run_cli("reindex", root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "shard-000001.tar" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
