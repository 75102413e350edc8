"""The HDF5 format: round trips, the documented layout read with plain h5py, options, bad input."""

from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packer.engine.pack_run import pack_folder
from packer.sources.source import scan_folder
from packer.transform.preprocess import preprocess_file
from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ImgpackError
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.image.decode import decode_array
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, packed_items, reference_pixels, run_cli
from tests.support.badinput import by_outcome, make_bad_corpus

SMALL = {"resize": 40}
FIXED = {"resize": 40, "crop": 32}
SPECS = {
    "jpeg": {**SMALL, "encode": "jpeg"},
    "png": {**SMALL, "encode": "png"},
    "bmp": {**SMALL, "encode": "bmp"},
    "raw": {**FIXED, "encode": "raw"},
    "original": {"encode": "original"},
}


@pytest.mark.parametrize("encoding", sorted(SPECS))
def test_round_trip_every_encoding(packed, encoding):
    spec = PreprocessSpec(**SPECS[encoding])
    path = packed("hdf5", **SPECS[encoding])
    reader = open_reader(path)
    scan = scan_folder(SAMPLE_DATA)
    assert len(reader) == len(scan.items) and reader.manifest.encoding == encoding
    block = reader.read_block(0, len(reader))
    for item, record in zip(packed_items(path), block):
        sample = preprocess_file(item.path, item.rel, item.label, item.index, spec)
        assert bytes(record.data) == sample.data  # stored bytes are exactly the packer's output
        assert (record.label, record.height, record.width, record.channels) == (
            item.label, sample.height, sample.width, sample.channels
        )  # fmt: skip
        assert bytes(reader.read(item.index).data) == sample.data
        if encoding in ("png", "bmp", "raw"):  # lossless: pixel-exact against Pillow's preprocess
            np.testing.assert_array_equal(decode_array(record), reference_pixels(item.path, spec))
    np.testing.assert_array_equal(reader.labels(), [item.label for item in packed_items(path)])


def test_plain_h5py_reading_as_the_formats_page_describes(packed):
    """Follow the "HDF5 layout" section of docs/formats.md with h5py, NumPy and Pillow only."""
    scan = scan_folder(SAMPLE_DATA)
    encoded = open_reader(packed("hdf5", **SPECS["png"]))
    raw = open_reader(packed("hdf5", **SPECS["raw"]))
    with h5py.File(encoded.root / "data-000000.h5", "r") as f:
        manifest = json.loads(f.attrs["imgpack_manifest"])
        assert manifest["classes"] == scan.classes and manifest["encoding"] == "png"
        assert f.attrs["layout"] == "flat" and f.attrs["first"] == 0
        images, offsets, labels = f["images"], f["offsets"][:], f["labels"][:]
        keys = f["keys"].asstr()[:]
        for i in (0, 17, len(labels) - 1):
            blob = images[offsets[i] : offsets[i + 1]].tobytes()
            pixels = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
            np.testing.assert_array_equal(pixels, decode_array(encoded.read(i)))
            assert tuple(f["shapes"][i]) == pixels.shape
            assert manifest["classes"][labels[i]] == keys[i].split("/")[0]
        assert list(keys) == [item.rel for item in packed_items(encoded.root)]
    with h5py.File(raw.root / "data-000000.h5", "r") as f:
        assert f.attrs["layout"] == "array" and f["images"].shape == (len(scan.items), 32, 32, 3)
        assert f["images"].chunks == (1, 32, 32, 3)
        np.testing.assert_array_equal(f["images"][5], decode_array(raw.read(5)))
        np.testing.assert_array_equal(f["labels"][:], raw.labels())


def test_shards_and_compression(packed):
    plain = open_reader(packed("hdf5", **SPECS["raw"]))
    sharded = open_reader(packed("hdf5", options={"shards": 3, "compression": "lzf"}, **SPECS["raw"]))
    assert [s.file for s in sharded.manifest.shards] == [f"data-00000{i}.h5" for i in range(3)]
    for shard in sharded.manifest.shards:
        with h5py.File(sharded.root / shard.file, "r") as f:
            assert f["images"].compression == "lzf"
            assert f.attrs["first"] == shard.first and len(f["labels"]) == shard.count
            assert (
                json.loads(f.attrs["imgpack_manifest"])["shards"][1]["first"]
                == sharded.manifest.shards[1].first
            )
    # A block that spans all three files reads the same as the single uncompressed file.
    for got, want in zip(sharded.read_block(3, 40), plain.read_block(3, 40)):
        assert bytes(got.data) == bytes(want.data) and got.label == want.label
    gz = open_reader(packed("hdf5", options={"compression": "gzip"}, **SPECS["jpeg"]))
    with h5py.File(gz.root / "data-000000.h5", "r") as f:
        assert f["images"].compression == "gzip"
    jpeg = open_reader(packed("hdf5", **SPECS["jpeg"]))
    assert [bytes(r.data) for r in gz.read_many([9, 2, 30])] == [
        bytes(r.data) for r in jpeg.read_many([9, 2, 30])
    ]


def test_raw_without_fixed_size_is_refused(tmp_path):
    with pytest.raises(ImgpackError, match="--crop"):
        pack_folder(SAMPLE_DATA, tmp_path / "x", "hdf5", PreprocessSpec(resize=32, encode="raw"))
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "hdf5", "-o", tmp_path / "y", "--encode", "raw")
    assert proc.returncode != 0 and "--resize-mode exact" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "y").exists()


def test_output_is_identical_for_any_worker_count_and_after_an_interrupted_finish(tmp_path, monkeypatch):
    spec = PreprocessSpec(**SPECS["jpeg"])
    one = pack_folder(SAMPLE_DATA, tmp_path / "one", "hdf5", spec, workers=1, options={"shards": 2})
    import packer.engine.pack_run

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # dies after finish() wrote the attributes, before the manifest

    monkeypatch.setattr(packer.engine.pack_run, "write_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(SAMPLE_DATA, tmp_path / "two", "hdf5", spec, workers=2, options={"shards": 2})
    monkeypatch.undo()
    pack_folder(SAMPLE_DATA, tmp_path / "two", "hdf5", spec, workers=2, options={"shards": 2}, resume=True)
    first, second = read_manifest(one.out), read_manifest(tmp_path / "two")
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]
    assert all(len(s.sha256) == 64 for s in first.shards)


def test_bad_input_corpus(tmp_path):
    corpus = make_bad_corpus(tmp_path / "src")
    groups = by_outcome(corpus)
    report = pack_folder(tmp_path / "src", tmp_path / "out", "hdf5", PreprocessSpec(**FIXED, encode="raw"))
    assert {s["path"] for s in report.skipped_files} == set(groups["skip"])
    assert all(s["reason"] for s in report.skipped_files)
    with h5py.File(tmp_path / "out" / "data-000000.h5", "r") as f:
        assert sorted(f["keys"].asstr()[:]) == sorted(groups["ok"])
    reader = open_reader(tmp_path / "out")
    assert all(decode_array(r).shape == (32, 32, 3) for r in reader.read_block(0, len(reader)))


def test_verify_detects_corruption(packed, tmp_path):
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(packed("hdf5", **SPECS["raw"]), path)
    assert run_cli("verify", path).returncode == 0
    data = path / "data-000000.h5"
    with h5py.File(data, "r") as f:
        where = f["images"].id.get_chunk_info(7).byte_offset + 100  # inside image 7's pixels
    opened = open_reader(path, verify=True)
    opened.read(0)  # the file's sha256 is checked when it is opened, before the corruption
    blob = bytearray(data.read_bytes())
    blob[where] ^= 0xFF
    with open(data, "r+b") as fh:  # in place: the open reader sees the change
        fh.write(blob)
    proc = run_cli("verify", path)
    assert proc.returncode == 1 and "sha256" in proc.stderr and "data-000000.h5" in proc.stderr
    with pytest.raises(ChecksumError, match="sha256"):
        open_reader(path, verify=True).read(0)
    # The per-image CRC32 catches it too, in a reader that opened the file before.
    with pytest.raises(ChecksumError, match="sample 7"):
        opened.read_block(0, 10)


def test_dataloader_workers(packed):
    path = packed("hdf5", **SPECS["raw"])
    reader = open_reader(path)
    expected = {i: decode_array(r) for i, r in enumerate(reader.read_block(0, len(reader)))}
    ds = open_dataset(path, decode="numpy")
    ds[0]  # the parent opens the file before the workers fork
    loader = DataLoader(ds, batch_size=None, num_workers=2, sampler=[5, 0, 43, 20])
    for index, (image, _) in zip([5, 0, 43, 20], loader):
        np.testing.assert_array_equal(image.numpy(), expected[index])
    it = open_iterable(path, shuffle=True, seed=3, batch_size=8)
    seen = []
    for images, labels in DataLoader(it, batch_size=None, num_workers=2):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        seen += [
            (int(label), image.permute(1, 2, 0).numpy().tobytes()) for image, label in zip(images, labels)
        ]
    labels = reader.labels()
    assert sorted(seen) == sorted((int(labels[i]), e.tobytes()) for i, e in expected.items())
