"""TFRecord shards: read back by the ``tfrecord`` package and DALI; CRC and index damage caught.

The format's reader guarantees (order, workers, ranks, resume, batch path, DALI feed) run with
every other format in the format contract (tests/support/format_contract/) and test_dali.py.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tfrecord import example_pb2
from tfrecord.reader import tfrecord_loader
from tfrecord.tools.tfrecord2idx import create_index

from readers import open_dataset, read_manifest
from readers.errors import ChecksumError
from readers.formats import open_reader
from readers.formats.tfrecord._example import decode_example, encode_example
from readers.formats.tfrecord.reader import scan_records
from readers.image.decode import decode_array
from readers.store.checksums import file_sha256
from readers.store.manifest import MANIFEST_NAME, SEAL_FIELD, seal_of
from tests.conftest import packed_items, run_cli

PNG = {"resize": 40, "crop": 40, "encode": "png"}


def shard_paths(root):
    records = sorted(root.glob("shard-*.tfrecord"))
    return [str(p) for p in records], [str(p.with_suffix(".idx")) for p in records]


def test_tfrecord_package_reads_images_and_labels(packed):
    root = packed("tfrecord", options={"samples_per_shard": 10}, resize=64)
    reader = open_reader(root)
    records, indexes = shard_paths(root)
    assert len(records) == 5
    seen = [example for r in records for example in tfrecord_loader(r, None)]
    assert len(seen) == len(reader) == 44
    # With our index, the package splits a shard into parts by record offsets.
    split = [e for k in range(3) for e in tfrecord_loader(records[1], indexes[1], shard=(k, 3))]
    assert [bytes(e["image/encoded"]) for e in split] == [bytes(e["image/encoded"]) for e in seen[10:20]]
    for i, example in enumerate(seen):
        record = reader.read(i)
        assert bytes(example["image/encoded"]) == bytes(record.data)
        assert int(example["image/class/label"][0]) == record.label
        assert (int(example["image/height"][0]), int(example["image/width"][0])) == (
            record.height,
            record.width,
        )
        assert bytes(example["image/format"]) == b"JPEG"
        assert bytes(example["image/colorspace"]) == b"RGB"
    names = [bytes(e["image/filename"]).decode() for e in seen]
    assert names == [item.rel for item in packed_items(root)] and names[0].count("/") == 1


def test_our_indexes_equal_the_tfrecord2idx_tool(packed, tmp_path):
    root = packed("tfrecord", options={"samples_per_shard": 10}, resize=64)
    records, indexes = shard_paths(root)
    for record, index in zip(records, indexes):
        theirs = tmp_path / "theirs.idx"
        create_index(record, str(theirs))
        assert open(index).read() == theirs.read_text()
        with open(record, "rb") as fh:
            offsets, sizes = scan_records(fh, record)
        assert open(index).read() == "".join(f"{o} {s}\n" for o, s in zip(offsets, sizes))


def test_example_encoding_matches_protobuf():
    features = {
        "image/encoded": b"\x00\xffbytes",
        "image/class/label": 7,
        "many": [1, -2, 2**40],
        "floats": [0.5, -1.25],
        "text": "ünïcode",
        "list": [b"a", b""],
    }
    data = encode_example(features)
    parsed = example_pb2.Example()
    parsed.ParseFromString(data)
    feature = parsed.features.feature
    assert feature["image/encoded"].bytes_list.value == [b"\x00\xffbytes"]
    assert list(feature["many"].int64_list.value) == [1, -2, 2**40]
    assert list(feature["floats"].float_list.value) == [0.5, -1.25]
    assert feature["text"].bytes_list.value == ["ünïcode".encode()]
    ours = decode_example(parsed.SerializeToString())
    assert (
        ours["many"] == [1, -2, 2**40] and ours["floats"] == [0.5, -1.25] and ours["image/class/label"] == [7]
    )
    assert [bytes(v) for v in ours["list"]] == [b"a", b""]


def dali_read(records, indexes, count, batch_size=4):
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, seed=0)
    def pipe():
        inputs = fn.readers.tfrecord(
            path=records,
            index_path=indexes,
            features={
                "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
            },
            name="tfr",
        )
        return fn.decoders.image(inputs["image/encoded"], device="cpu"), inputs["image/class/label"]

    pipeline = pipe()
    pipeline.build()
    assert pipeline.epoch_size("tfr") == count
    images, labels = [], []
    while len(images) < count:
        out_images, out_labels = pipeline.run()
        for k in range(len(out_images)):
            images.append(np.array(out_images[k]))
            labels.append(int(np.array(out_labels[k])[0]))
    return images[:count], labels[:count]


def test_dali_tfrecord_reader_uses_our_indexes(packed):
    root = packed("tfrecord", options={"samples_per_shard": 16}, **PNG)
    reader = open_reader(root)
    records, indexes = shard_paths(root)
    images, labels = dali_read(records, indexes, len(reader))
    assert labels == reader.labels().tolist()
    for i, image in enumerate(images):
        assert np.array_equal(image, decode_array(reader.read(i)))


def label_file_matches_the_records(root) -> None:
    reader = open_reader(root)
    entry = json.loads((root / MANIFEST_NAME).read_text())["extra"]["labels"]
    stored = np.fromfile(root / entry["file"], dtype="<i8").tolist()
    labels = [reader.read(i).label for i in range(len(reader))]
    assert stored == labels == reader.labels().tolist()


def test_label_file_spans_parts_and_shards(packed):
    label_file_matches_the_records(packed("tfrecord", options={"samples_per_shard": 7}, **PNG))


def damaged_copy(root, tmp_path, where) -> tuple:
    """A copy of ``root`` with one byte of shard 0 flipped at ``where(offsets, sizes)`` and the
    manifest's sha256 updated, so only the TFRecord CRCs can tell."""
    copy = tmp_path / "damaged"
    shutil.copytree(root, copy)
    shard = copy / "shard-000000.tfrecord"
    with open(shard, "rb") as fh:
        offsets, sizes = scan_records(fh, str(shard))
    position = where(offsets, sizes)
    data = bytearray(shard.read_bytes())
    data[position] ^= 0x10
    shard.write_bytes(bytes(data))
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["shards"][0]["sha256"] = file_sha256(shard)
    manifest[SEAL_FIELD] = seal_of(manifest)  # a consistent manifest: only the CRCs can tell
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    return copy, offsets


@pytest.mark.parametrize(
    "where, message",
    [
        (lambda offsets, sizes: offsets[3] + sizes[3] // 2, "data fails its CRC32C"),  # image bytes
        (lambda offsets, sizes: offsets[3] + 2, "length fails its CRC"),  # the length field
    ],
    ids=["data", "length"],
)
def test_crc_errors_are_caught_by_reader_and_verify(packed, tmp_path, where, message):
    copy, _ = damaged_copy(packed("tfrecord", options={"samples_per_shard": 16}, **PNG), tmp_path, where)
    ds = open_dataset(copy, decode="numpy")
    ds[2]  # the records around it are fine
    with pytest.raises(ChecksumError, match=message) as error:
        ds[3]
    assert "shard-000000.tfrecord: record 3 (sample 3)" in str(error.value)
    proc = run_cli("verify", copy)
    assert proc.returncode == 1
    assert message in proc.stderr and "record 3" in proc.stderr


def test_missing_index_is_rebuilt_with_a_warning(packed, tmp_path):
    root = packed("tfrecord", options={"samples_per_shard": 16}, **PNG)
    copy = tmp_path / "noidx"
    shutil.copytree(root, copy)
    (copy / "shard-000001.idx").unlink()
    with pytest.warns(UserWarning, match="shard-000001.idx: index missing.*pack reindex"):
        ours = [bytes(r.data) for r in open_reader(copy).read_block(0, 44)]
    assert ours == [bytes(r.data) for r in open_reader(root).read_block(0, 44)]
    run_cli("reindex", copy, check=True)
    assert (copy / "shard-000001.idx").read_text() == (root / "shard-000001.idx").read_text()


def test_cli_packs_tfrecord_and_verify_passes(sample_dir, tmp_path):
    out = tmp_path / "cli"
    run_cli(
        "imagefolder",
        sample_dir,
        "--to",
        "tfrecord",
        "-o",
        out,
        "--resize",
        "48",
        "--workers",
        "2",
        check=True,
    )
    assert run_cli("verify", out).returncode == 0
    label_file_matches_the_records(out)


def test_check_crc_false_skips_only_the_data_crc(packed, tmp_path):
    root = packed("tfrecord", options={"samples_per_shard": 16}, **PNG)
    copy, _ = damaged_copy(root, tmp_path, lambda offsets, sizes: offsets[3] + sizes[3] // 2)
    unchecked = open_dataset(copy, decode="bytes", reader_options={"check_crc": False})
    assert unchecked[3][0] != open_dataset(root, decode="bytes")[3][0]  # the flipped byte goes through
    with pytest.raises(ChecksumError, match="data fails its CRC32C"):
        open_dataset(copy, decode="bytes", verify=True, reader_options={"check_crc": False})[3]
    lengths, _ = damaged_copy(root, tmp_path / "l", lambda offsets, sizes: offsets[3] + 2)
    with pytest.raises(ChecksumError, match="length fails its CRC"):
        open_dataset(lengths, decode="bytes", reader_options={"check_crc": False})[3]


# -- a TFRecord record whose stored size disagrees with its image -------------------------


def _swap_stored_sizes(path):
    """Rewrite every record of a TFRecord dataset with height and width swapped in its features
    (the same byte length, CRCs recomputed): what a foreign or hand-edited record may hold."""
    from readers.formats.tfrecord._example import decode_example, encode_example
    from readers.formats.tfrecord.reader import META_FEATURE, frame

    for shard in read_manifest(path).shards:
        data, out = (path / shard.file).read_bytes(), b""
        while data:
            length = int.from_bytes(data[:8], "little")
            features = {k: [bytes(x) if isinstance(x, memoryview) else x for x in v]
                        for k, v in decode_example(data[12 : 12 + length]).items()}  # fmt: skip
            meta = features[META_FEATURE.decode()]
            meta[1], meta[2] = meta[2], meta[1]
            features["image/height"], features["image/width"] = (
                features["image/width"],
                features["image/height"],
            )
            payload = encode_example(features)
            assert len(payload) == length
            out += frame(payload)
            data = data[12 + length + 4 :]
        (path / shard.file).write_bytes(out)


def test_tfrecord_image_size_comes_from_the_image_on_every_path(tmp_path, packed):
    from readers import open_dataset, open_iterable

    original = packed("tfrecord", resize=40, encode="jpeg")
    tampered = tmp_path / "tampered"
    shutil.copytree(original, tampered)
    _swap_stored_sizes(tampered)
    n = len(open_dataset(original))

    def batch(path):
        return next(iter(open_iterable(path, shuffle=False, batch_size=n, crop=32)))[0].numpy()

    assert np.array_equal(batch(tampered), batch(original))  # the batch path
    ours, theirs = open_dataset(tampered, decode="numpy"), open_dataset(original, decode="numpy")
    assert all(np.array_equal(ours[i][0], theirs[i][0]) for i in range(n))  # the map path
