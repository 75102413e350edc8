"""The tar format: WebDataset layout, DALI-format indexes, rollover, determinism, reading, bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from packer.engine.pack_run import pack_folder
from packer.sources.source import scan_folder
from packer.transform.preprocess import exif_orientation
from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ManifestError
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.image.decode import decode_array
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, packed_items, run_cli

SPLIT = {"samples_per_shard": 10}


def shard_files(root: Path) -> list[Path]:
    return sorted(root.glob("shard-*.tar"))


def digest_tree(root: Path) -> dict[str, str]:
    files = [p for p in sorted(root.iterdir()) if p.suffix != ".json"]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_shards_are_plain_ustar_webdataset(packed):
    root = packed("tar", options=SPLIT, resize=64)
    manifest = read_manifest(root)
    tars = shard_files(root)
    assert [p.name for p in tars] == [f"shard-{i:06d}.tar" for i in range(5)]
    assert [s.count for s in manifest.shards] == [10, 10, 10, 10, 4]
    keys: list[str] = []
    for path, shard in zip(tars, manifest.shards):
        assert path.stat().st_size == shard.bytes
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with tarfile.open(path) as archive:
                members = archive.getmembers()
        assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
        assert all(not m.pax_headers for m in members)
        names = [m.name for m in members]
        # Members of a sample are adjacent: image, cls, json.
        assert [n.split(".", 1)[1] for n in names] == ["jpg", "cls", "json"] * shard.count
        assert all(n.count(".") == 1 for n in names)
        keys += [n.split(".")[0] for n in names[::3]]
        listed = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
        assert listed.stdout.split() == names and listed.stderr == ""
        header = path.read_bytes()[257:263]
        assert header == b"ustar\x00"
    assert len(set(keys)) == len(keys) == manifest.num_samples
    with tarfile.open(tars[0]) as archive:
        meta = json.load(archive.extractfile(archive.getmembers()[2]))
        cls = archive.extractfile(archive.getmembers()[1]).read()
    items = packed_items(root)
    assert meta["path"] == items[0].rel and meta["class"] == items[0].rel.split("/")[0]
    assert cls == str(items[0].label).encode() and meta["label"] == items[0].label
    assert len(meta["original_size"]) == 2


def test_index_is_what_dali_wds2idx_writes(packed, tmp_path):
    from wds2idx import IndexCreator

    root = packed("tar", options=SPLIT, resize=64)
    for path in shard_files(root):
        ref = tmp_path / (path.stem + ".idx")
        with IndexCreator(str(path), str(ref), verbose=False) as creator:
            creator.create_index()
        assert path.with_suffix(".idx").read_bytes() == ref.read_bytes()


def test_rollover_by_bytes_never_exceeds_the_limit(tmp_path):
    limit = 20_000
    out = tmp_path / "ds"
    pack_folder(SAMPLE_DATA, out, "tar", PreprocessSpec(resize=64), workers=1, options={"shard_size": limit})
    manifest = read_manifest(out)
    assert len(manifest.shards) > 2 and manifest.num_samples == 44
    for shard in manifest.shards:
        assert (out / shard.file).stat().st_size == shard.bytes
        assert shard.bytes <= limit or shard.count == 1
    # Only single-sample shards may pass the limit: a tiny limit gives one sample per shard.
    tiny = tmp_path / "tiny"
    pack_folder(SAMPLE_DATA, tiny, "tar", PreprocessSpec(resize=64), workers=1, options={"shard_size": 4096})
    assert [s.count for s in read_manifest(tiny).shards] == [1] * 44


def test_parts_rolling_over_are_renumbered_in_order(tmp_path):
    # Parts of 20 samples (samples_per_shard) that roll over by bytes into several files each.
    out = tmp_path / "ds"
    options = {"samples_per_shard": 20, "shard_size": 40_000}
    pack_folder(SAMPLE_DATA, out, "tar", PreprocessSpec(resize=64), workers=2, options=options)
    manifest = read_manifest(out)
    names = [s.file for s in manifest.shards]
    assert names == [f"shard-{i:06d}.tar" for i in range(len(names))] and len(names) > 3
    assert not list(out.glob("part-*"))
    assert sorted(p.name for p in out.glob("*.idx")) == [n.replace(".tar", ".idx") for n in names]
    reader = open_reader(out)
    expected = [item.label for item in packed_items(out)]
    assert [reader.read(i).label for i in range(44)] == expected
    assert reader.labels().tolist() == expected


def test_output_is_identical_for_any_worker_count(tmp_path):
    spec = PreprocessSpec(resize=48)
    trees = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        pack_folder(SAMPLE_DATA, out, "tar", spec, workers=workers, options={"samples_per_shard": 16})
        trees.append(digest_tree(out))
    assert trees[0] == trees[1] and len(trees[0]) == 9  # 3 shards, 3 indexes, 3 sidecars


@pytest.mark.ray
@pytest.mark.slow
def test_ray_engine_writes_the_same_shards(tmp_path):
    spec = PreprocessSpec(resize=48)
    options = {"samples_per_shard": 16, "shard_size": 30_000}
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    pack_folder(SAMPLE_DATA, local, "tar", spec, workers=1, options=options)
    pack_folder(SAMPLE_DATA, ray_out, "tar", spec, engine="ray", options=options)
    assert digest_tree(local) == digest_tree(ray_out)
    assert read_manifest(local).shards == read_manifest(ray_out).shards


def test_map_style_reads_match_read_block_and_labels(packed):
    root = packed("tar", options=SPLIT, resize=64)
    reader = open_reader(root)
    items = packed_items(root)
    singles = [reader.read(i) for i in range(len(reader))]
    block = reader.read_block(3, 37)  # crosses three shard boundaries
    assert [bytes(r.data) for r in block] == [bytes(r.data) for r in singles[3:37]]
    many = reader.read_many([40, 2, 2, 11, 39])
    assert [bytes(r.data) for r in many] == [bytes(singles[i].data) for i in (40, 2, 2, 11, 39)]
    assert [r.label for r in singles] == [item.label for item in items] == reader.labels().tolist()
    for record in singles:
        image = decode_array(record)
        assert image.shape == (record.height, record.width, 3) and min(image.shape[:2]) == 64
    ds = open_dataset(root, decode="tensor")
    image, label = ds[5]
    assert tuple(image.shape) == (3, singles[5].height, singles[5].width) and label == items[5].label


def test_raw_and_original_encodings(packed):
    raw = packed("tar", options=SPLIT, resize=32, crop=32, encode="raw")
    reader = open_reader(raw)
    assert all(r.shape == (32, 32, 3) for r in reader.read_block(0, 44))
    with tarfile.open(raw / "shard-000000.tar") as archive:
        assert archive.getnames()[0].endswith(".raw")
        meta = json.load(archive.extractfile(archive.getnames()[2]))
    assert meta["shape"] == [32, 32, 3]
    original = packed("tar", encode="original")
    names = tarfile.open(original / "shard-000000.tar").getnames()
    items = packed_items(original)
    exts = [n.split(".")[1] for n in names[::3]]
    # Extension sniffed from content, e.g. chelsea.png stays png, LADYBIRD_01.JPG becomes jpg; an
    # EXIF-rotated JPEG is stored upright, as PNG.
    rotated = [exif_orientation(Image.open(item.path)) != 1 for item in items]
    assert any(rotated) and not all(rotated)
    expected = ["png" if item.rel.endswith(".png") or turn else "jpg" for item, turn in zip(items, rotated)]
    assert exts == expected
    record = open_reader(original).read(1)
    assert bytes(record.data) == Path(items[1].path).read_bytes()


def test_iterable_with_workers_reads_every_sample_once(packed):
    root = packed("tar", options=SPLIT, resize=32, crop=32)
    kwargs = dict(shuffle=True, seed=3, batch_size=8, block_size=10, buffer_size=20)
    loader = DataLoader(open_iterable(root, **kwargs), batch_size=None, num_workers=2)
    labels = np.concatenate([batch[1].numpy() for batch in loader])
    in_process = DataLoader(open_iterable(root, **kwargs), batch_size=None)
    single = np.concatenate([batch[1].numpy() for batch in in_process])
    assert labels.tolist() == single.tolist()
    assert sorted(labels.tolist()) == sorted(item.label for item in scan_folder(SAMPLE_DATA).items)


# -- bad input ---------------------------------------------------------------------------------


def copy_dataset(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_truncated_last_shard_names_the_shard(packed, tmp_path):
    root = copy_dataset(packed("tar", options=SPLIT, resize=64), tmp_path / "ds")
    last = shard_files(root)[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    reader = open_reader(root)
    assert reader.read(0).label == packed_items(root)[0].label  # the other shards still read
    with pytest.raises(ManifestError, match="shard-000004.tar: shard is truncated"):
        reader.read(43)
    assert run_cli("verify", root).returncode == 1


def test_missing_index_is_rebuilt_with_a_warning_and_by_reindex(packed, tmp_path):
    root = copy_dataset(packed("tar", options=SPLIT, resize=64), tmp_path / "ds")
    idx = root / "shard-000001.idx"
    original = idx.read_bytes()
    idx.unlink()
    reader = open_reader(root)
    with pytest.warns(UserWarning, match=r"shard-000001.idx: index missing.*pack reindex"):
        record = reader.read(15)
    assert record.label == open_reader(packed("tar", options=SPLIT, resize=64)).read(15).label
    proc = run_cli("reindex", root, check=True)
    assert "wrote 5 index file(s)" in proc.stdout
    assert idx.read_bytes() == original


def test_checksum_mismatch_under_verify_names_the_shard(packed, tmp_path):
    root = copy_dataset(packed("tar", options=SPLIT, resize=64), tmp_path / "ds")
    shard = root / "shard-000002.tar"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # inside the first image: same size, different bytes
    shard.write_bytes(bytes(data))
    assert open_reader(root).read(20).label >= 0  # without verify nothing is checked
    with pytest.raises(ChecksumError, match="shard-000002.tar: sha256 does not match"):
        open_reader(root, verify=True).read(20)
    proc = run_cli("verify", root)
    assert proc.returncode == 1 and "shard-000002.tar" in proc.stderr


def test_pack_verify_passes_on_a_good_dataset(packed):
    proc = run_cli("verify", packed("tar", options=SPLIT, resize=64))
    assert proc.returncode == 0 and "OK" in proc.stdout


def test_compression_is_refused(tmp_path):
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "tar", "-o", tmp_path / "x", "--compression", "gzip")
    assert proc.returncode != 0 and "drop --compression" in proc.stderr


def test_interrupted_pack_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    from readers.formats.tar import writer as tar_writer

    spec, options = PreprocessSpec(resize=48), {"samples_per_shard": 10, "shard_size": 15_000}
    clean = tmp_path / "clean"
    pack_folder(SAMPLE_DATA, clean, "tar", spec, workers=1, options=options)
    out = tmp_path / "out"
    real_add = tar_writer.TarPartWriter.add
    calls = []

    def failing_add(self, sample):
        calls.append(sample.source_index)
        if len(calls) == 25:  # in the middle of the third part, after it rolled over once
            raise KeyboardInterrupt
        real_add(self, sample)

    monkeypatch.setattr(tar_writer.TarPartWriter, "add", failing_add)
    with pytest.raises(KeyboardInterrupt):
        pack_folder(SAMPLE_DATA, out, "tar", spec, workers=1, options=options)
    assert not (out / "manifest.json").exists() and list(out.glob("part-000001-*.tar"))
    assert not list(out.glob("part-000002-*"))  # the aborted part left nothing
    monkeypatch.setattr(tar_writer.TarPartWriter, "add", real_add)
    pack_folder(SAMPLE_DATA, out, "tar", spec, workers=1, options=options, resume=True)
    assert digest_tree(out) == digest_tree(clean)
    assert read_manifest(out).shards == read_manifest(clean).shards


def test_shards_option_splits_evenly(tmp_path):
    out = tmp_path / "ds"
    proc = run_cli(
        "imagefolder", SAMPLE_DATA, "--to", "tar", "-o", out, "--resize", "32", "--shards", "3", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert [s.count for s in read_manifest(out).shards] == [15, 15, 14]
