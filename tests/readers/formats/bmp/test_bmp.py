"""The BMP cache: pixels, the tree as an ImageFolder, name collisions, the codec, verify, bad input."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packer.engine.pack_run import pack_folder
from packer.sources.source import scan_folder
from readers import ImgpackError, open_dataset, open_iterable
from readers.errors import ChecksumError, ManifestError
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.image.bmpcodec import decode_bmp, encode_bmp
from readers.image.decode import decode_array
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, packed_items, reference_pixels, run_cli
from tests.support.badinput import by_outcome, make_bad_corpus

SPEC = {"resize": 40}


def index_rows(root: Path) -> list[list]:
    rows = []
    for shard in read_manifest(root).shards:
        lines = (root / shard.file).read_text().splitlines()
        assert json.loads(lines[0])["count"] == shard.count
        rows += [json.loads(line) for line in lines[1:]]
    return rows


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_round_trip_is_pixel_exact_and_pillow_agrees(packed, mode):
    path = packed("bmp", options={"shards": 2}, mode=mode, **SPEC)
    reader = open_reader(path)
    scan = scan_folder(SAMPLE_DATA)
    spec = PreprocessSpec(mode=mode, encode="bmp", **SPEC)
    assert reader.manifest.encoding == "bmp" and len(reader) == len(scan.items)
    rows = index_rows(path)
    for item, record, row in zip(packed_items(path), reader.read_block(0, len(reader)), rows):
        assert row[7] == item.rel and record.label == item.label == row[1]
        ours = decode_array(record)
        np.testing.assert_array_equal(ours, reference_pixels(item.path, spec))
        with Image.open(path / row[0]) as img:  # the file on disk, read by Pillow
            assert img.format == "BMP" and img.mode == mode
            theirs = np.asarray(img)
        np.testing.assert_array_equal(ours, theirs[:, :, None] if mode == "L" else theirs)
        assert (path / row[0]).read_bytes()[28] == (8 if mode == "L" else 24)  # bits per pixel
    np.testing.assert_array_equal(reader.labels(), [item.label for item in packed_items(path)])


def test_tree_is_an_image_folder_with_the_same_labels(packed):
    path = packed("bmp", **SPEC)
    manifest = read_manifest(path)
    scan = scan_folder(path)
    assert scan.classes == manifest.classes
    assert all(item.rel.endswith(".bmp") for item in scan.items)
    by_file = {row[0]: row[1] for row in index_rows(path)}
    assert {item.rel: item.label for item in scan.items} == by_file
    # Two sources per collision in sample_data (chelsea.jpg/png, coins_gray.jpg/png): both kept.
    assert manifest.extra["bmp"]["renamed"] == {
        "animals/chelsea.png": "animals/chelsea.png.bmp",
        "objects/coins_gray.png": "objects/coins_gray.png.bmp",
    }
    assert not (path / ".staging").exists()


def test_name_collisions_across_parts_are_deterministic(tmp_path):
    src = tmp_path / "src"
    (src / "c" / "sub").mkdir(parents=True)
    (src / "d").mkdir()
    photo = Image.open(SAMPLE_DATA / "animals" / "chelsea.jpg").convert("RGB")
    names = ["a.jpg", "A.PNG", "a.png", "a.png.bmp", "b.jpg", "sub/a.jpg", "zz.gif"]
    for k, name in enumerate(names):
        fmt = {".jpg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".gif": "GIF"}[Path(name.lower()).suffix]
        photo.crop((k * 10, 0, k * 10 + 60, 50)).save(src / "c" / name, fmt)
    photo.crop((0, 0, 30, 30)).save(src / "d" / "a.jpg")
    spec = PreprocessSpec(encode="png")  # --to bmp stores BMP whatever --encode says
    outs = []
    for shards, workers in ((1, 1), (4, 2)):
        out = tmp_path / f"out{shards}"
        pack_folder(src, out, "bmp", spec, workers=workers, options={"shards": shards}, order="source")
        outs.append(out)
    rows1, rows4 = index_rows(outs[0]), index_rows(outs[1])
    assert [r[:7] for r in rows1] == [r[:7] for r in rows4]
    files = {r[7]: r[0] for r in rows1}
    assert files == {
        "c/A.PNG": "c/A.bmp",
        "c/a.jpg": "c/a.jpg.bmp",  # 'A.PNG' sorts first and claims a.bmp (names compared case-insensitively)
        "c/a.png": "c/a.png.bmp",
        "c/a.png.bmp": "c/a.png.bmp.bmp",
        "c/b.jpg": "c/b.bmp",
        "c/sub/a.jpg": "c/sub/a.bmp",
        "c/zz.gif": "c/zz.bmp",
        "d/a.jpg": "d/a.bmp",
    }
    assert read_manifest(outs[1]).extra["bmp"]["renamed"] == {k: v for k, v in files.items() if k in (
        "c/a.jpg", "c/a.png", "c/a.png.bmp")}  # fmt: skip
    for rel, name in files.items():  # every source kept its own pixels
        np.testing.assert_array_equal(
            np.asarray(Image.open(outs[1] / name)), reference_pixels(str(src / rel), PreprocessSpec())
        )
    assert len(list(outs[1].rglob("*.bmp"))) == len(names) + 1
    shuffled = tmp_path / "shuffled"  # classes interleaved: a name is still never claimed twice
    pack_folder(src, shuffled, "bmp", spec, workers=2, options={"shards": 3}, order="shuffled", seed=1)
    for rel, name in ((r[7], r[0]) for r in index_rows(shuffled)):
        np.testing.assert_array_equal(
            np.asarray(Image.open(shuffled / name)), reference_pixels(str(src / rel), PreprocessSpec())
        )
    assert len(list(shuffled.rglob("*.bmp"))) == len(names) + 1


@pytest.mark.parametrize("swap", ["opencv", "numpy"])
def test_codec_against_pillow(monkeypatch, swap):
    import readers.image.bmpcodec

    if swap == "numpy":
        monkeypatch.setattr(readers.image.bmpcodec, "cv2", None)  # the path without the cv extra
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (13, 7, 3), dtype=np.uint8)  # odd width: padded rows
    grey = rng.integers(0, 256, (5, 9), dtype=np.uint8)
    cases = {
        "rgb24_bottom_up": (Image.fromarray(rgb), {}),
        "grey8": (Image.fromarray(grey), {}),
        "palette8": (Image.fromarray(rgb).quantize(17), {}),
        "rgba32": (Image.fromarray(np.dstack([rgb, rgb[:, :, :1]])), {}),
        "mono1": (Image.fromarray(grey > 128), {}),  # 1-bit: the Pillow fallback
    }
    for name, (img, kwargs) in cases.items():
        buffer = io.BytesIO()
        img.save(buffer, "BMP", **kwargs)
        with Image.open(io.BytesIO(buffer.getvalue())) as back:
            grey_like = back.mode in ("1", "L")
            want = np.asarray(back.convert("L" if grey_like else "RGB"))
        got = decode_bmp(buffer.getvalue())
        np.testing.assert_array_equal(
            got[:, :, 0] if got.ndim == 3 and grey_like else got, want, err_msg=name
        )
    for array in (rgb, grey):
        data = encode_bmp(array)
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), array)
        np.testing.assert_array_equal(decode_bmp(data).reshape(array.shape), array)
    with pytest.raises(ValueError, match="truncated"):
        decode_bmp(encode_bmp(rgb)[:-40])


def test_bad_input_corpus(tmp_path):
    corpus = make_bad_corpus(tmp_path / "src")
    groups = by_outcome(corpus)
    report = pack_folder(tmp_path / "src", tmp_path / "out", "bmp", PreprocessSpec(resize=32))
    assert {s["path"] for s in report.skipped_files} == set(groups["skip"])
    rows = index_rows(tmp_path / "out")
    assert sorted(r[7] for r in rows) == sorted(groups["ok"])
    manifest = read_manifest(tmp_path / "out")
    assert scan_folder(tmp_path / "out").classes == manifest.classes  # empty classes keep their folder
    reader = open_reader(tmp_path / "out")
    assert all(decode_array(r).shape[2] == 3 for r in reader.read_block(0, len(reader)))


def test_verify_detects_a_changed_or_missing_file(packed, tmp_path):
    path = tmp_path / "ds"
    shutil.copytree(packed("bmp", **SPEC), path)
    assert run_cli("verify", path).returncode == 0
    victim = path / index_rows(path)[11][0]
    blob = bytearray(victim.read_bytes())
    blob[-5] ^= 0xFF  # a pixel: the file still decodes, only the checksum can tell
    victim.write_bytes(bytes(blob))
    proc = run_cli("verify", path)
    assert proc.returncode == 1 and victim.name in proc.stderr
    with pytest.raises(ChecksumError):
        open_reader(path, verify=True).read(11)
    victim.unlink()
    with pytest.raises(ManifestError, match="missing"):
        open_reader(path).read(11)
    (path / "files-000000.jsonl").write_text("{}\n")
    assert "sha256" in run_cli("verify", path).stderr


def test_cli_to_bmp_implies_bmp_and_resume_after_an_interrupted_finish(tmp_path, monkeypatch):
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "bmp", "-o", tmp_path / "cli", "--resize", "24", "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(tmp_path / "cli").encoding == "bmp"
    import packer.engine.pack_run

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # after finish() moved the files, before the manifest

    monkeypatch.setattr(packer.engine.pack_run, "write_manifest", crash)
    spec = PreprocessSpec(resize=24)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(SAMPLE_DATA, tmp_path / "api", "bmp", spec, options={"shards": 2})
    monkeypatch.undo()
    pack_folder(SAMPLE_DATA, tmp_path / "api", "bmp", spec, options={"shards": 2}, resume=True)
    assert index_rows(tmp_path / "api") == index_rows(tmp_path / "cli")
    assert read_manifest(tmp_path / "api").extra["bmp"]["renamed"] == read_manifest(tmp_path / "cli").extra[
        "bmp"]["renamed"]  # fmt: skip


def test_dataloader_workers(packed):
    path = packed("bmp", **SPEC)
    reader = open_reader(path)
    expected = sorted((r.label, decode_array(r).tobytes()) for r in reader.read_block(0, len(reader)))
    seen = []
    for image, label in DataLoader(open_dataset(path, decode="numpy"), batch_size=None, num_workers=2):
        seen.append((int(label), image.numpy().tobytes()))
    assert sorted(seen) == expected
    crop = packed("bmp", resize=40, crop=32)
    it = open_iterable(crop, shuffle=True, seed=1, batch_size=16)
    total = 0
    for images, labels in DataLoader(it, batch_size=None, num_workers=2):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        total += len(labels)
    assert total == len(reader)


def test_bmp_read_many_opens_only_the_wanted_files(packed, tmp_path):
    cache = tmp_path / "bmp"
    shutil.copytree(packed("bmp", resize=40, crop=32), cache)
    ds = open_dataset(cache, decode="numpy")
    third = cache / json.loads((cache / "files-000000.jsonl").read_text().splitlines()[4])[0]
    third.unlink()  # sample 3 lies between samples 0 and 5, inside the old merge gap of 8
    from readers.formats import open_reader

    reader = open_reader(cache)
    assert [r.label for r in reader.read_many([0, 5])] == [ds.targets[0], ds.targets[5]]
    with pytest.raises(ImgpackError, match="missing"):
        reader.read_many([3])
