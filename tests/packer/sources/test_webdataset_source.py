"""pack webdataset: WebDataset shards written by the real ``webdataset.TarWriter`` (and the same
samples as a folder tree) re-packed with their classes, captions and JSON fields; bad samples are
skips with a reason."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import webdataset as wds
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from readers import open_dataset

CAPTIONS = ["un café noir", "a red square", "Grüße aus Köln", "東京の夜"]


def jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), value, np.uint8)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def samples():
    for i in range(12):
        yield {
            "__key__": f"s{i:03d}",
            "jpg": jpeg(20 * i),
            "cls": str(i % 3).encode(),
            "txt": CAPTIONS[i % 4].encode(),
            "json": json.dumps({"score": i / 10, "source": f"http://x/{i}"}).encode(),
        }
    yield {"__key__": "bad-text", "jpg": jpeg(1), "cls": b"0", "txt": b"\xff\xfe"}
    yield {"__key__": "bad-cls", "jpg": jpeg(1), "cls": b"cat"}
    yield {"__key__": "no-image", "cls": b"1", "txt": b"orphan"}


@pytest.fixture
def shards(tmp_path):
    paths = []
    items = list(samples())
    for n, part in enumerate((items[:8], items[8:])):
        path = tmp_path / f"data-{n:06d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for sample in part:
                sink.write(sample)
        paths.append(path)
    return paths


def test_tar_shards_repack_with_classes_captions_and_json_fields(shards, tmp_path):
    out = tmp_path / "out-tar"
    args = ["webdataset", *map(str, shards), "--to", "tar", "-o", str(out), "--workers", "1", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 12 and manifest["classes"] == ["0", "1", "2"]
    reasons = sorted(s["reason"] for s in manifest["skipped"])
    assert len(reasons) == 3
    assert any("not valid UTF-8" in r for r in reasons) and any("not an integer class" in r for r in reasons)
    assert any("no image member" in r for r in reasons)
    ds = open_dataset(out, fields=["caption", "score", "source"])
    got = {target["source"]: target for _, target in (ds[i] for i in range(len(ds)))}
    for i in range(12):
        target = got[f"http://x/{i}"]
        assert target["caption"] == CAPTIONS[i % 4] and target["label"] == i % 3
        assert target["score"] == pytest.approx(i / 10)
    # and the peers read the re-packed shards as usual
    urls = [str(p) for p in sorted(out.glob("*.tar"))]
    pairs = list(wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg", "txt"))
    assert sorted(t for _, t in pairs) == sorted(CAPTIONS[i % 4] for i in range(12))


def test_folder_tree_repacks_the_same(shards, tmp_path):
    import tarfile

    tree = tmp_path / "tree"
    for shard in shards:
        with tarfile.open(shard) as tar:
            tar.extractall(tree / "part", filter="data")
    out = tmp_path / "out.lmdb"
    result = CliRunner().invoke(main, ["webdataset", str(tree), "--to", "lmdb", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    ds = open_dataset(out, fields=["caption"])
    assert sorted(ds[i][1]["caption"] for i in range(len(ds))) == sorted(CAPTIONS[i % 4] for i in range(12))


def test_not_a_shard_is_one_clear_line(tmp_path):
    bad = tmp_path / "x.tar"
    bad.write_bytes(b"not a tar")
    result = CliRunner().invoke(main, ["webdataset", str(bad), "--to", "lmdb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "not a readable tar shard" in result.output


def test_a_folder_of_shards_says_to_name_them(shards, tmp_path):
    folder = shards[0].parent
    result = CliRunner().invoke(main, ["webdataset", str(folder), "--to", "lmdb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "no WebDataset sample" in result.output
    assert f"it holds tar shards: name them (pack webdataset {folder}/*.tar" in result.output


def write_shard(path, samples):
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


def test_shards_of_one_name_in_two_folders_keep_their_samples_apart(tmp_path):
    """Issue 32: x/data.tar and y/data.tar merged the samples sharing a key (one got y's image,
    x's label and y's caption; the other was lost)."""
    shards = []
    for n, folder in enumerate("xy"):
        caption = f"{folder}{{}}".format
        part = [
            {"__key__": f"s{i}", "jpg": jpeg(40 * n + 10 * i), "cls": b"%d" % n, "txt": caption(i).encode()}
            for i in range(4)
        ]
        shards.append(write_shard(tmp_path / folder / "data.tar", part))
    out = tmp_path / "out.lmdb"
    args = ["webdataset", *map(str, shards), "--to", "lmdb", "-o", str(out), "--encode", "png", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ds = open_dataset(out, decode="numpy", fields=["caption"])
    samples = (ds[i] for i in range(len(ds)))
    got = sorted((t["caption"], t["label"], int(image[0, 0, 0])) for image, t in samples)
    want = sorted((f"{folder}{i}", n, 40 * n + 10 * i) for n, folder in enumerate("xy") for i in range(4))
    assert len(got) == 8 and all(abs(g[2] - w[2]) <= 2 and g[:2] == w[:2] for g, w in zip(got, want))


def test_a_member_repeated_inside_a_shard_is_a_skip_naming_it(tmp_path):
    """Issue 32: the first copy was silently dropped; webdataset itself refuses such a shard."""
    import tarfile

    shard = tmp_path / "dup.tar"
    members = [("a.jpg", jpeg(10)), ("a.cls", b"0"), ("b.jpg", jpeg(20)), ("b.cls", b"1")]
    members.append(("b.jpg", jpeg(90)))  # b's image again: which one is b?
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="duplicate"):
        list(wds.WebDataset(str(shard), shardshuffle=False))
    out = tmp_path / "out.lmdb"
    result = CliRunner().invoke(main, ["webdataset", str(shard), "--to", "lmdb", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 1
    (skip,) = manifest["skipped"]
    assert "dup.tar" in skip["reason"] and "b.jpg appears twice" in skip["reason"]


def test_the_same_shard_twice_is_one_clear_line(shards, tmp_path):
    args = ["webdataset", str(shards[0]), str(shards[0]), "--to", "lmdb", "-o", str(tmp_path / "o")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "given twice" in result.output


def test_a_member_kind_twice_in_a_folder_tree_is_a_skip(tmp_path):
    """``x.jpg`` beside ``x.JPG`` are both the image of sample x: neither is silently dropped."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name, data in [("x.jpg", jpeg(10)), ("x.JPG", jpeg(90)), ("x.cls", b"0"), ("y.jpg", jpeg(5))]:
        (tree / name).write_bytes(data)
    out = tmp_path / "out.lmdb"
    result = CliRunner().invoke(main, ["webdataset", str(tree), "--to", "lmdb", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 1
    (skip,) = manifest["skipped"]
    assert "are both .jpg" in skip["reason"] and "sample x" in skip["reason"]
