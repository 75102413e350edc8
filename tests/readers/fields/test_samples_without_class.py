"""Issue 32: samples without a class pack and read on every path (item 4), and hostile fields are
skips with a reason, never a crash (the "crashes and refusals" paragraph).

Real components: WebDataset shards written by ``webdataset.TarWriter``, Parquet by pyarrow, packs
through the real CLI, reads through map-style, per-sample, whole-batch and DataLoader paths.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from packer.info.verify import verify_dataset
from packer.scan.rows import Row, pack_rows
from packer.sources.coco import scan_coco
from packer.sources.imagelist import scan_list
from readers import make_loader, mix, open_dataset, open_iterable
from readers.errors import ImgpackError
from readers.formats.registry import format_names, formats_storing_fields
from readers.store.manifest import read_manifest
from tests.support.cocodata import draw_rectangles, rect_of

DEEP = "[" * 2500 + "]" * 2500  # deeper than Python's JSON parser can go


def jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), value, np.uint8)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def pack(*args: str) -> str:
    result = CliRunner().invoke(main, [*map(str, args), "--workers", "1", "-q", "--order", "source"])
    assert result.exit_code == 0, result.output
    return result.output


def read_labels(out: Path, fields: list[str] | None = None) -> dict[str, list]:
    """The labels every path gives: map-style, per-sample, whole batches, per-sample batches."""
    ds = open_dataset(out, fields=fields)
    kw = {"crop": 16, "shuffle": False, "fields": fields}
    target = (lambda t: t["label"]) if fields else (lambda t: t)
    batched = make_loader(open_iterable(out, batch_size=2, **kw))
    per_sample = make_loader(open_iterable(out, **kw), batch_size=2, num_workers=1)
    return {
        "map": [int(target(ds[i][1])) for i in range(len(ds))],
        "sample": [int(target(t)) for _, t in open_iterable(out, **kw)],
        "batch": [int(v) for _, t in batched for v in target(t)],
        "loader": [int(v) for _, t in per_sample for v in target(t)],
    }


# -- WebDataset: no .cls, .cls -1, hostile .cls and .json ---------------------------------------
@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wds") / "data-000000.tar"
    members = [
        ("a0", {"cls": b"0"}),
        ("a1", {}),  # no .cls: no class
        ("a2", {"cls": b"-1"}),
        ("a3", {"cls": b"1"}),
        ("bad-negative", {"cls": b"-5"}),
        ("bad-superscript", {"cls": "²".encode()}),
        ("bad-huge", {"cls": b"100000000000000000"}),  # 1e17 class names would not fit in memory
        ("bad-deep", {"json": DEEP.encode()}),
    ]
    with wds.TarWriter(str(path)) as sink:
        for i, (key, extra) in enumerate(members):
            sink.write({"__key__": key, "jpg": jpeg(20 * i), **extra})
    return path


@pytest.mark.parametrize("fmt", format_names())
def test_webdataset_samples_without_a_class_read_on_every_path(shard, tmp_path, fmt):
    out = tmp_path / "out"
    pack("webdataset", shard, "--to", fmt, "-o", out)
    manifest = read_manifest(out)
    assert manifest.fields == {} and manifest.classes == ["0", "1"]
    reasons = {s["path"].split("/")[-1].split(".")[0]: s["reason"] for s in manifest.skipped}
    assert sorted(reasons) == ["bad-deep", "bad-huge", "bad-negative", "bad-superscript"]
    assert "'-5', not an integer class" in reasons["bad-negative"]
    assert "'²', not an integer class" in reasons["bad-superscript"]
    assert "outside the 2 classes" in reasons["bad-huge"]
    assert "nested too deeply" in reasons["bad-deep"]
    for path, labels in read_labels(out).items():
        assert labels == [0, -1, -1, 1], path
    assert verify_dataset(out).ok


def test_a_webdataset_json_nested_past_the_field_limit_is_a_skip(tmp_path):
    path = tmp_path / "d.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write({"__key__": "ok", "jpg": jpeg(1), "json": b'{"tags": [[1], [2]]}'})
        sink.write(
            {"__key__": "deep", "jpg": jpeg(2), "json": json.dumps({"t": "[" * 300 + "]" * 300}).encode()}
        )
        sink.write({"__key__": "deeper", "jpg": jpeg(3), "json": ("[" * 300 + "]" * 300).encode()})
    out = tmp_path / "out"
    pack("webdataset", path, "--to", "lmdb", "-o", out)
    skipped = read_manifest(out).skipped
    assert [s["path"] for s in skipped] == ["d/deeper.jpg"] and "nested deeper than" in skipped[0]["reason"]
    ds = open_dataset(out, fields=["t"])
    assert sorted(str(ds[i][1]["t"]) for i in range(2)) == [
        "None",
        "[" * 300 + "]" * 300,
    ]  # text, not nesting


# -- Parquet: null and huge labels ----------------------------------------------------------------
def test_parquet_null_label_reads_and_a_huge_label_is_a_skip(tmp_path):
    table = pa.table({"image": [jpeg(10 * i) for i in range(4)], "label": [1, None, 10**15, 0]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    out = tmp_path / "out"
    pack("parquet", path, "--to", "tar", "-o", out)
    manifest = read_manifest(out)
    assert manifest.classes == ["0", "1"] and manifest.fields == {}
    (skip,) = manifest.skipped
    assert skip["reason"].startswith("t.parquet row 2: label 1000000000000000 is outside the 2 classes")
    for where, labels in read_labels(out).items():
        assert labels == [1, -1, 0], where


# -- captions and tags without a class (item 4) ---------------------------------------------------
@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return draw_rectangles(tmp_path_factory.mktemp("nc-images"), 6)


def test_a_caption_only_jsonl_packs_with_no_label_and_reads_everywhere(images, tmp_path):
    captions = images / "captions.jsonl"
    captions.write_text(
        "".join(json.dumps({"image": f"{i:02d}.png", "caption": f"Bild {i}"}) + "\n" for i in range(6))
    )
    refused = CliRunner().invoke(
        main, ["imagelist", str(captions), "--to", "lmdb", "-o", str(tmp_path / "x")]
    )
    assert refused.exit_code == 1 and "--no-label for a set without classes" in refused.output
    for fmt in formats_storing_fields():
        out = tmp_path / fmt
        pack("imagelist", captions, "--no-label", "--to", fmt, "-o", out)
        assert read_manifest(out).fields == {"caption": "str"}
        for where, labels in read_labels(out, ["caption"]).items():
            assert labels == [-1] * 6, where
        batch = next(
            iter(make_loader(open_iterable(out, crop=16, shuffle=False, fields=["caption"]), batch_size=3))
        )
        assert batch[1]["caption"] == ["Bild 0", "Bild 1", "Bild 2"]


def test_a_csv_without_a_label_column_and_a_label_of_minus_one(images, tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("path,caption\n" + "".join(f"{i:02d}.png,photo {i}\n" for i in range(3)))
    scan = scan_list(csv, images, no_label=True)
    assert [item.label for item in scan.items] == [-1] * 3 and scan.fields == {"caption": "str"}
    labelled = tmp_path / "l.csv"
    labelled.write_text("path,label\n00.png,cat\n01.png,-1\n02.png,dog\n")
    scan = scan_list(labelled, images)
    assert scan.classes == ["cat", "dog"] and [item.label for item in scan.items] == [0, -1, 1]
    with pytest.raises(ImgpackError, match="--no-label packs a list without a label column"):
        scan_list(labelled, images, label_column="label", no_label=True)


def test_a_tags_only_csv_packs_with_multi_label(images, tmp_path):
    tags = images / "tags.csv"
    tags.write_text(
        "path,tags\n" + "".join(f"{i:02d}.png,{'cat|dog' if i % 2 else 'tree'}\n" for i in range(6))
    )
    out = tmp_path / "tags"
    pack("imagelist", tags, "--label-column", "tags", "--multi-label", "|", "--to", "tfrecord", "-o", out)
    ds = open_dataset(out, fields=["labels"])
    assert ds.classes == ["cat", "dog", "tree"]
    assert [ds[i][1]["labels"].tolist() for i in range(2)] == [[2], [0, 1]]
    assert read_labels(out, ["labels"])["loader"] == [-1] * 6


def test_mix_keeps_minus_one_as_no_class_whatever_the_offset(images, tmp_path):
    labelled, captions = tmp_path / "labelled", tmp_path / "captions"
    pack_rows([Row(f"{i:02d}.png", 0) for i in range(3)], images, ["a", "b"], labelled, "lmdb", workers=1)
    rows = [Row(f"{i:02d}.png", -1, {"caption": f"c{i}"}) for i in range(3)]
    pack_rows(rows, images, ["0"], captions, "tar", workers=1)
    mixed = mix([labelled, captions], batch_size=3, crop=16, seed=0)
    labels = [int(v) for _, t in mixed for v in t]
    assert sorted(labels) == [-1, -1, -1, 0, 0, 0]  # not -1 + 2, which is class "b" of the mix
    dataset, within = mixed.split_labels(np.array([0, 1, 2, -1]))
    assert dataset.tolist() == [0, 0, 1, -1] and within.tolist() == [0, 1, 0, -1]


# -- hostile values in a list are skips, never a traceback ----------------------------------------
def test_nan_infinity_and_deep_json_in_a_list_are_skips_with_the_line(images, tmp_path):
    lines = [
        '{"path": "00.png", "label": 0, "scores": [0.5, 1.5]}',
        '{"path": "01.png", "label": 0, "scores": [0.5, NaN]}',
        '{"path": "02.png", "label": 0, "scores": [Infinity]}',
        '{"path": "03.png", "label": 0, "scores": [1.0], "meta": ' + DEEP + "}",
        '{"path": "04.png", "label": 0, "scores": [], "meta": ' + "[" * 200 + "]" * 200 + "}",
    ]
    path = tmp_path / "l.jsonl"
    path.write_text("\n".join(lines) + "\n")
    scan = scan_list(path, images)
    assert len(scan) == 1
    reasons = [s["reason"] for s in scan.skipped]
    assert reasons[0].startswith("l.jsonl line 2: field 'scores'") and "NaN" in reasons[0]
    assert reasons[1].startswith("l.jsonl line 3: field 'scores'")
    assert reasons[2].startswith("l.jsonl line 4: JSON nested too deeply")
    assert reasons[3].startswith("l.jsonl line 5: field 'meta': JSON nested deeper than")


def test_a_list_of_ints_with_an_empty_row_stays_ints_and_pads(images, tmp_path):
    path = tmp_path / "l.jsonl"
    rows = [[1, 2], [], [3]]
    path.write_text(
        "".join(json.dumps({"path": f"{i:02d}.png", "label": 0, "ids": r}) + "\n" for i, r in enumerate(rows))
    )
    scan = scan_list(path, images)
    assert scan.fields == {"ids": "ints"}
    out = tmp_path / "ds"
    pack_rows([Row(f"{i:02d}.png", 0, {"ids": r}) for i, r in enumerate(rows)], images, ["a"], out, "lmdb",
              scan.fields, workers=1, order="source")  # fmt: skip
    batch = next(
        iter(open_iterable(out, crop=16, shuffle=False, batch_size=3, fields=["ids"], pad_fields=True))
    )
    assert batch[1]["ids"].tolist() == [[1, 2], [-1, -1], [3, -1]] and batch[1]["ids_count"].tolist() == [
        2,
        0,
        1,
    ]


# -- COCO: deep JSON and ids that cannot key anything --------------------------------------------
def coco_file(path: Path, images: list, annotations: list) -> Path:
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 1, "name": "box"}]}))  # fmt: skip
    return path


def test_coco_deep_json_and_unhashable_ids_are_one_line_or_a_skip(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"images": [], "annotations": [], "categories": [], "info": ' + DEEP + "}")
    with pytest.raises(ImgpackError, match="deep.json: not a COCO annotation file .*nested too deeply"):
        scan_coco(deep)
    bad_image = coco_file(tmp_path / "a.json", [{"id": [1], "file_name": "00.png"}], [])
    with pytest.raises(ImgpackError, match=r"a.json: no image to pack .*images\[0\]: id \[1\] is not an"):
        scan_coco(bad_image)
    image = {"id": 1, "file_name": "00.png", "height": 60, "width": 80}
    anns = [{"image_id": {"x": 1}, "bbox": [1, 1, 5, 5], "category_id": 1},
            {"image_id": 1, "bbox": [1, 1, 5, 5], "category_id": [1]},
            {"image_id": 1, "bbox": [1, 1, 5, 5], "category_id": 1}]  # fmt: skip
    scan = scan_coco(coco_file(tmp_path / "b.json", [image], anns))
    assert [s["reason"] for s in scan.skipped] == [
        'b.json annotations[0]: image_id {"x": 1} is not an id (a number or a text; true/false is not one)',
        "b.json annotations[1]: category_id [1] is not an id (a number or a text; true/false is not one)",
    ]
    assert scan.rows[0].fields["boxes"] == [[1.0, 1.0, 5.0, 5.0]]


# -- the per-sample path batches boxes ------------------------------------------------------------
def test_make_loader_batches_per_sample_boxes_as_the_batch_path_does(images, tmp_path):
    rows = [Row(f"{i:02d}.png", i % 2, {"boxes": [list(rect_of(i))] * (i % 3), "n": i}) for i in range(6)]
    out = tmp_path / "boxed"
    pack_rows(
        rows, images, ["a", "b"], out, "lmdb", {"boxes": "boxes", "n": "int"}, workers=1, order="source"
    )
    kw = {"crop": 40, "shuffle": False, "fields": ["boxes", "n"]}
    per_sample = list(make_loader(open_iterable(out, **kw), batch_size=3, num_workers=1))
    whole = list(make_loader(open_iterable(out, batch_size=3, **kw)))
    assert len(per_sample) == len(whole) == 2
    for (images_a, a), (images_b, b) in zip(per_sample, whole):
        assert torch.equal(images_a, images_b) and torch.equal(a["label"], b["label"])
        assert torch.equal(a["n"], b["n"]) and a["label"].dtype == torch.int64
        assert all(isinstance(x, torch.Tensor) for x in a["boxes"])
        assert [x.tolist() for x in a["boxes"]] == [x.tolist() for x in b["boxes"]]
    padded = next(iter(make_loader(open_iterable(out, pad_fields=True, **kw), batch_size=3)))[1]
    assert padded["boxes"].shape == (3, 2, 4) and padded["boxes_count"].tolist() == [0, 1, 2]
