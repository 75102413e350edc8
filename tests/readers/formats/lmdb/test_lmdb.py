"""Packing sample_data into LMDB and reading every sample back."""

from __future__ import annotations

import filecmp

import numpy as np
import pytest
from PIL import Image, ImageOps
from torch.utils.data import DataLoader

from packer.engine.pack_run import pack_folder
from packer.sources.source import scan_folder
from packer.transform.preprocess import exif_orientation, preprocess_file
from readers import open_dataset, read_manifest
from readers.errors import ManifestError
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import FORMAT_VERSION
from tests.conftest import SAMPLE_DATA, packed_items


def source_image(path: str) -> np.ndarray:
    """What the packer should store for a source file: orientation applied, RGB."""
    with Image.open(path) as img:
        img = ImageOps.exif_transpose(img)
        if img.mode in ("RGBA", "LA", "P"):
            rgba = img.convert("RGBA")
            img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        return np.asarray(img.convert("RGB"))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("encode", ["png", "raw", "bmp"])
def test_lossless_round_trip_is_pixel_exact(packed, encode):
    out = packed("lmdb", encode=encode)
    ds = open_dataset(out, decode="numpy")
    scan = scan_folder(SAMPLE_DATA)
    assert len(ds) == len(scan.items) == read_manifest(out).num_samples
    for i, item in enumerate(packed_items(out)):
        image, label = ds[i]
        assert label == item.label
        np.testing.assert_array_equal(image, source_image(item.path), err_msg=item.rel)


def test_original_keeps_source_bytes(packed):
    """Byte for byte, except an EXIF-rotated file: its upright pixels, losslessly (PNG)."""
    out = packed("lmdb", encode="original")
    ds = open_dataset(out, decode="bytes")
    pixels = open_dataset(out, decode="numpy")
    rotated = 0
    for i, item in enumerate(packed_items(out)):
        with Image.open(item.path) as img:
            turned = exif_orientation(img) != 1
        if turned:
            assert ds[i][0].startswith(b"\x89PNG"), item.rel
            np.testing.assert_array_equal(pixels[i][0], source_image(item.path), err_msg=item.rel)
            rotated += 1
            continue
        with open(item.path, "rb") as fh:
            assert ds[i][0] == fh.read(), item.rel
    assert 0 < rotated < len(ds)


def test_jpeg_round_trip_within_psnr_bound(packed):
    out = packed("lmdb", encode="jpeg", quality=90)
    ds = open_dataset(out, decode="numpy")
    for i, item in enumerate(packed_items(out)):
        image, _ = ds[i]
        expected = source_image(item.path)
        assert image.shape == expected.shape, item.rel
        assert psnr(image, expected) > 30, item.rel


def test_resize_and_crop(packed):
    out = packed("lmdb", encode="png", resize=64, crop=48)
    ds = open_dataset(out, decode="numpy")
    scan = scan_folder(SAMPLE_DATA)
    for i in (0, 7, len(ds) - 1):
        image, _ = ds[i]
        assert image.shape == (48, 48, 3)
        spec = PreprocessSpec(resize=64, crop=48, encode="png")
        item = scan.items[i]
        expected = preprocess_file(item.path, item.rel, item.label, i, spec)
        assert (expected.height, expected.width) == (48, 48)


def test_resize_modes_and_no_upscale(packed):
    shorter = open_dataset(packed("lmdb", encode="raw", resize=100), decode="numpy")
    longer = open_dataset(packed("lmdb", encode="raw", resize=100, resize_mode="longer"), decode="numpy")
    for i in range(len(shorter)):
        assert min(shorter[i][0].shape[:2]) == 100
        assert max(longer[i][0].shape[:2]) == 100
    big_out = packed("lmdb", encode="raw", resize=5000)
    big = open_dataset(big_out, decode="numpy")
    assert big[0][0].shape == source_image(packed_items(big_out)[0].path).shape  # never upscaled by default


def test_labels_and_classes_follow_sorted_folders(packed):
    out = packed("lmdb", encode="jpeg", resize=32)
    manifest = read_manifest(out)
    assert manifest.classes == sorted(p.name for p in SAMPLE_DATA.iterdir() if p.is_dir())
    ds = open_dataset(out, decode="bytes")
    labels = [ds[i][1] for i in range(len(ds))]
    assert labels == [item.label for item in packed_items(out)] != sorted(labels)
    assert ds.targets == labels
    assert set(labels) == set(range(len(manifest.classes)))


def test_output_is_byte_identical_for_any_worker_count(tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        pack_folder(SAMPLE_DATA, out, "lmdb", PreprocessSpec(resize=48), workers=workers)
        outs.append(out)
    a, b = (o / "data-000000.lmdb" / "data.mdb" for o in outs)
    assert filecmp.cmp(a, b, shallow=False)
    ma, mb = read_manifest(outs[0]), read_manifest(outs[1])
    assert ma.shards == mb.shards and ma.num_samples == mb.num_samples


def test_several_shards_read_like_one(tmp_path, packed):
    one = open_dataset(packed("lmdb", encode="png", resize=32), decode="numpy")
    out = tmp_path / "sharded"
    pack_folder(SAMPLE_DATA, out, "lmdb", PreprocessSpec(resize=32, encode="png"), options={"shards": 3})
    many = open_dataset(out, decode="numpy")
    assert len(read_manifest(out).shards) == 3
    assert len(many) == len(one)
    for i in range(len(one)):
        np.testing.assert_array_equal(many[i][0], one[i][0])
        assert many[i][1] == one[i][1]
    blocks = many.reader.read_block(0, len(many))
    assert [r.label for r in blocks] == many.targets


def test_dataloader_with_worker_processes(packed):
    ds = open_dataset(packed("lmdb", encode="jpeg", resize=40, crop=32), decode="tensor")
    ds[0]  # the parent opens the environment before forking: workers must reopen their own
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    seen = 0
    labels = []
    for images, batch_labels in loader:
        assert images.shape[1:] == (3, 32, 32)
        seen += len(images)
        labels += batch_labels.tolist()
    assert seen == len(ds)
    assert labels == ds.targets


def test_ram_cache_matches_disk(packed):
    out = packed("lmdb", encode="jpeg", resize=40)
    disk = open_dataset(out, decode="numpy")
    ram = open_dataset(out, decode="numpy", cache="ram")
    for i in range(len(disk)):
        np.testing.assert_array_equal(disk[i][0], ram[i][0])
        assert disk[i][1] == ram[i][1]


def test_incomplete_dataset_is_refused(tmp_path, packed):
    with pytest.raises(ManifestError, match="no manifest.json"):
        open_dataset(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "lmdb"')
    with pytest.raises(ManifestError, match="unreadable or partial"):
        open_dataset(tmp_path)
    newer = (
        read_manifest(packed("lmdb", encode="jpeg", resize=32))
        .to_json()
        .replace(f'"format_version": {FORMAT_VERSION}', '"format_version": 99')
    )
    (tmp_path / "manifest.json").write_text(newer)
    with pytest.raises(ManifestError, match="newer than this imgpack"):
        open_dataset(tmp_path)


def test_interrupted_pack_resumes(tmp_path, monkeypatch):
    from packer.engine import _local_engine as engine  # where the local engine writes its parts

    out = tmp_path / "ds"
    calls = {"n": 0}
    real = engine.write_part

    def failing_after_two_parts(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "write_part", failing_after_two_parts)
    spec = PreprocessSpec(resize=32, encode="png")
    with pytest.raises(KeyboardInterrupt):
        pack_folder(SAMPLE_DATA, out, "lmdb", spec, workers=2, options={"shards": 4})
    assert not (out / "manifest.json").exists()
    with pytest.raises(ManifestError):
        open_dataset(out)
    monkeypatch.setattr(engine, "write_part", real)
    resumed_parts = []
    monkeypatch.setattr(
        engine, "write_part", lambda w, p, *a, **k: resumed_parts.append(p) or real(w, p, *a, **k)
    )
    pack_folder(SAMPLE_DATA, out, "lmdb", spec, workers=2, options={"shards": 4}, resume=True)
    assert resumed_parts == [2, 3]  # only the parts that had not finished
    fresh = tmp_path / "fresh"
    pack_folder(SAMPLE_DATA, fresh, "lmdb", spec, workers=1, options={"shards": 4})
    a, b = open_dataset(out, decode="numpy"), open_dataset(fresh, decode="numpy")
    assert len(a) == len(b)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i][0], b[i][0])


def test_downscaled_jpegs_match_a_plain_pillow_resize(packed):
    """JPEGs are decoded with DCT-domain scaling before the resize: the result must still be the
    same picture, upright, as Pillow's decode + exif_transpose + resize."""
    out = packed("lmdb", encode="png", resize=100)
    ds = open_dataset(out, decode="numpy")
    for i, item in enumerate(packed_items(out)):
        image, _ = ds[i]
        reference = Image.fromarray(source_image(item.path))
        scale = 100 / min(reference.size)
        size = (round(reference.width * scale), round(reference.height * scale))
        expected = np.asarray(reference.resize(size, Image.Resampling.BILINEAR))
        assert image.shape == expected.shape, item.rel
        assert psnr(image, expected) > 25, item.rel


def test_read_many_looks_up_a_shuffled_batch_across_shards_in_one_pass(tmp_path, monkeypatch):
    out = tmp_path / "sharded"
    pack_folder(
        SAMPLE_DATA, out, "lmdb", PreprocessSpec(resize=32, crop=32, encode="raw"), options={"shards": 3}
    )
    reader = open_dataset(out, decode="numpy").reader
    expected = [(bytes(r.data), r.label) for r in (reader.read(i) for i in range(len(reader)))]
    wanted = np.random.default_rng(0).permutation(len(reader))[:20].tolist() + [0, 0, len(reader) - 1]

    def per_record(*args):
        raise AssertionError("read_many went through read_local: one Python call per record")

    monkeypatch.setattr(type(reader), "read_local", per_record)
    got = reader.read_many(wanted)
    assert [(bytes(r.data), r.label) for r in got] == [expected[i] for i in wanted]


def test_read_many_refuses_an_index_outside_the_dataset(packed):
    reader = open_dataset(packed("lmdb", encode="raw", resize=32, crop=32), decode="numpy").reader
    for bad in ([3, len(reader)], [-1, 2]):
        with pytest.raises((IndexError, ManifestError), match=str(bad[0] if bad[0] < 0 else bad[1])):
            reader.read_many(bad)
