"""The per-record checksum covers the label: an edited label is caught by verify, in every format."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import h5py
import pytest

from readers.errors import ChecksumError
from readers.formats import format_names, open_reader
from readers.store.record import ENCODING_CODES, HEADER
from tests.support.damage import assert_verify_fails, copy_of, reseal


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
    from readers.formats.tfrecord._example import varint
    from readers.store.checksums import masked_crc

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
