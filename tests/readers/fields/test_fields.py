"""Samples with more than a label (issue 23): sources with fields, and fields on every read path.

Real components: images written to disk, packed by the real engine, read by real DataLoader
workers (batches through the shared-memory ring), tar shards read by the real ``webdataset``.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from packer.engine.pack_run import pack_folder
from packer.scan.rows import Row, pack_rows
from packer.sources.imagelist import scan_list
from readers import RandomResizedCrop, make_loader, mix, open_dataset, open_iterable
from readers.errors import ImgpackError, OptionError
from readers.store.manifest import read_manifest
from readers.store.record import pack_record, unpack_record
from tests.conftest import run_cli
from tests.support.cocodata import draw_rectangles, rect_of

SOURCE_ORDER = ("--order", "source")  # these tests index samples in the source's order

N = 24


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return draw_rectangles(tmp_path_factory.mktemp("field-images"), N)


def write_jsonl(path: Path, entries: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n", encoding="utf-8")
    return path


def caption_list(images: Path) -> Path:
    return write_jsonl(
        images / "captions.jsonl",
        [{"image": f"{i:02d}.png", "label": i % 3, "caption": f"ein Bild Nr. {i} – été"} for i in range(N)],
    )


@pytest.fixture(scope="module")
def boxed(images, tmp_path_factory) -> Path:
    """The images with their drawn rectangle as a box (and a category per box), losslessly in LMDB."""
    rows = [
        Row(f"{i:02d}.png", i % 2, {"boxes": [list(rect_of(i))], "cats": [i % 4], "n": i}) for i in range(N)
    ]
    out = tmp_path_factory.mktemp("boxed") / "ds"
    pack_rows(rows, images, ["a", "b"], out, "lmdb", {"boxes": "boxes", "cats": "box_ints", "n": "int"},
              workers=1, order="source")  # fmt: skip
    return out


# -- sources ----------------------------------------------------------------------------------
def test_imagelist_keeps_extra_columns_typed_from_the_data(images, tmp_path):
    csv = tmp_path / "list.csv"
    lines = ["path,label,score,count,note"]
    for i in range(6):
        score = i if i < 3 else i + 0.5  # ints then floats: widened to float
        lines.append(f"{images / f'{i:02d}.png'},{i % 2},{score},{i},{'' if i == 2 else f'note {i}'}")
    csv.write_text("\n".join(lines) + "\n")
    scan = scan_list(csv, images)
    assert scan.fields == {"score": "float", "count": "int", "note": "str"}
    out = tmp_path / "ds"
    pack_folder(scan, out, "lmdb", workers=1, order="source")
    assert read_manifest(out).field_counts == {"score": 6, "count": 6, "note": 5}
    ds = open_dataset(out, fields=["score", "count", "note"])
    assert ds[4][1] == {"label": 0, "score": 4.5, "count": 4, "note": "note 4"}
    assert ds[2][1]["note"] is None
    assert scan_list(csv, images, fields=["count"]).fields == {"count": "int"}
    assert scan_list(csv, images, no_fields=True).fields == {}


def test_a_field_whose_type_changes_skips_the_row_with_its_line(images, tmp_path):
    entries = [{"path": f"{i:02d}.png", "label": 0, "size": "big" if i == 3 else i} for i in range(5)]
    entries.append({"path": "05.png", "label": 0, "box": [[1, 2, float("nan"), 4]]})
    lst = tmp_path / "l.jsonl"
    lst.write_text("\n".join(json.dumps(e) for e in entries))  # json.dumps writes NaN
    scan = scan_list(lst, images, fields=["size"])
    assert len(scan) == 6 - 1
    assert [s["reason"] for s in scan.skipped] == ["l.jsonl line 4: field 'size': \"big\" is not an integer"]
    every = scan_list(lst, images)  # the NaN in a JSON value is a skip too
    assert len(every) == 6 - 2 and "line 6: field 'box': not a JSON value" in every.skipped[1]["reason"]


def test_multi_label_splits_the_label_column(images, tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text(
        "path,tags\n" + "".join(f"{i:02d}.png,{'cat|dog' if i % 2 else 'dog'}\n" for i in range(4))
    )
    scan = scan_list(csv, images, label_column="tags", multi_label="|")
    assert scan.classes == ["cat", "dog"]
    out = tmp_path / "ds"
    pack_folder(scan, out, "tar", workers=1, order="source")
    ds = open_dataset(out, fields=["labels"])
    assert ds[1][1]["label"] == -1 and ds[1][1]["labels"].tolist() == [0, 1]
    assert ds[2][1]["labels"].tolist() == [1]


def test_pack_imagelist_cli_fields_and_webdataset_reads_the_captions(images, tmp_path):
    import webdataset

    out = tmp_path / "tar"
    proc = run_cli(
        "imagelist",
        caption_list(images),
        "--root",
        images,
        "--to",
        "tar",
        "-o",
        out,
        "--quiet",
        *SOURCE_ORDER,
    )
    assert proc.returncode == 0, proc.stderr
    shards = sorted(glob.glob(str(out / "*.tar")))
    got = [
        c for _, c in webdataset.WebDataset(shards, shardshuffle=False).decode("pil").to_tuple("jpg", "txt")
    ]
    assert got == [f"ein Bild Nr. {i} – été" for i in range(N)]
    info = run_cli("info", out)
    assert "caption" in info.stdout and "str" in info.stdout, info.stdout
    bmp = tmp_path / "b"
    ok = run_cli(
        "imagelist", caption_list(images), "--root", images, "--to", "bmp", "-o", bmp, "--no-fields", "-q"
    )
    assert ok.returncode == 0, ok.stderr
    assert read_manifest(bmp).fields == {} and isinstance(open_dataset(bmp)[0][1], int)


# -- reading ----------------------------------------------------------------------------------
def rectangle_in(image: np.ndarray) -> tuple[float, float, float, float]:
    """(x, y, w, h) of the bright pixels of an HWC image."""
    ys, xs = np.nonzero(image[..., 0] > 127)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())


def iou(a, b) -> float:
    ax1, ay1, bx1, by1 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    w = max(0.0, min(ax1, bx1) - max(a[0], b[0]))
    h = max(0.0, min(ay1, by1) - max(a[1], b[1]))
    inter = w * h
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


@pytest.mark.parametrize("batched", [False, True])
def test_boxes_follow_resize_random_crop_and_flip_on_both_paths(boxed, batched):
    crop = RandomResizedCrop(48, scale=(0.6, 1.0))
    options = {"batch_size": 8} if batched else {"decode": "numpy"}
    it = open_iterable(boxed, crop=crop, flip=0.5, fields=["boxes", "cats", "geometry"], seed=3, layout="HWC",
                       **options)  # fmt: skip
    checked = flipped = 0
    for images, target in it if batched else ((im[None], t) for im, t in it):
        boxes = target["boxes"] if batched else [target["boxes"]]
        geometries = target["geometry"] if batched else [target["geometry"]]
        for k in range(len(boxes)):
            image = np.asarray(images[k])
            if boxes[k].shape[0] == 0:  # cropped away: nothing bright may be left
                assert (image[..., 0] > 127).sum() < 20
                continue
            assert iou(rectangle_in(image), boxes[k][0].tolist()) >= 0.8
            flipped += geometries[k]["flip"]
            checked += 1
    assert checked >= N // 2 and 0 < flipped < checked


def test_batches_from_workers_carry_collated_fields_and_pad_fields(boxed):
    it = open_iterable(
        boxed, batch_size=6, crop=40, fields=["boxes", "cats", "n"], pad_fields=True, shuffle=False
    )
    loader = make_loader(it, num_workers=2)
    seen = []
    for images, target in loader:
        assert images.shape == (6, 3, 40, 40)
        assert target["n"].dtype == torch.int64 and target["label"].tolist() == [
            n % 2 for n in target["n"].tolist()
        ]
        assert target["boxes"].shape[0] == 6 and target["boxes"].shape[2] == 4
        assert target["boxes_count"].tolist() == [1] * 6 and target["cats_count"].tolist() == [1] * 6
        assert target["cats"][:, 0].tolist() == [n % 4 for n in target["n"].tolist()]
        seen += target["n"].tolist()
    assert sorted(seen) == list(range(N))
    plain = next(iter(open_iterable(boxed, batch_size=6, crop=40, shuffle=False)))
    assert isinstance(plain[1], torch.Tensor)  # without fields=: (images, labels) as always


def test_resume_with_persistent_workers_and_fields_gives_the_same_boxes(boxed):
    def reader():
        it = open_iterable(
            boxed, batch_size=4, crop=RandomResizedCrop(40), flip=True, fields=["boxes", "n"], seed=5
        )
        return make_loader(it, num_workers=2, persistent_workers=True)

    full = [(t["n"].tolist(), [b.tolist() for b in t["boxes"]]) for _, t in reader()]
    loader = reader()
    stream = iter(loader)
    head = [next(stream) for _ in range(2)]
    state = loader.state_dict()
    resumed = reader()
    resumed.load_state_dict(state)
    tail = [(t["n"].tolist(), [b.tolist() for b in t["boxes"]]) for _, t in resumed]
    got = [(t["n"].tolist(), [b.tolist() for b in t["boxes"]]) for _, t in head] + tail
    assert got == full


def test_mix_reads_the_fields_every_dataset_has(boxed, images, tmp_path):
    other = tmp_path / "other"
    rows = [Row(f"{i:02d}.png", 0, {"n": 100 + i}) for i in range(8)]
    pack_rows(rows, images, ["a", "b"], other, "tar", {"n": "int"}, workers=1, order="source")
    mixed = mix([boxed, other], batch_size=4, crop=40, fields=["n"], seed=1)
    ns = [n for _, t in mixed for n in t["n"].tolist()]
    assert any(n >= 100 for n in ns) and any(n < 100 for n in ns)
    with pytest.raises(OptionError, match="'boxes'.*every dataset.*n"):
        mix([boxed, other], batch_size=4, crop=40, fields=["boxes"])


def test_field_options_are_checked_at_construction(boxed):
    with pytest.raises(OptionError, match="pad_fields= pads"):
        open_iterable(boxed, batch_size=4, crop=40, pad_fields=True)
    with pytest.raises(OptionError, match="min_visibility"):
        open_iterable(boxed, fields=["boxes"], min_visibility=2)


def test_stored_fields_are_under_the_record_checksum():
    value = bytearray(pack_record(b"pixels", -1, 2, 1, 3, "raw", b'{"caption":"x"}'))
    record = unpack_record(value, verify=True)
    assert bytes(record.data) == b"pixels" and bytes(record.fields) == b'{"caption":"x"}'
    value[-8] ^= 0x01  # inside the fields
    with pytest.raises(Exception, match="checksum"):
        unpack_record(value, verify=True)


def test_dali_loader_fallback_returns_fields_with_the_boxes_moved(boxed):
    from readers import dali_loader

    loader = dali_loader(
        boxed, batch_size=8, crop=40, device="dataloader", fields=["boxes", "n"], num_workers=1
    )
    seen = 0
    for images, target in loader:
        for k in range(images.shape[0]):
            x, y, w, h = rect_of(int(target["n"][k]))
            box = target["boxes"][k][0].tolist()
            # the centre crop 40 x 40 of 60 x 80 starts at (left 20, top 10); the box is clipped to it
            x0, y0 = max(0, x - 20), max(0, y - 10)
            x1, y1 = min(40, x - 20 + w), min(40, y - 10 + h)
            assert box == pytest.approx([x0, y0, x1 - x0, y1 - y0], abs=1e-4)
            seen += 1
    assert seen == N


def test_multi_label_takes_a_json_list_of_labels(images, tmp_path):
    entries = [
        {"path": f"{i:02d}.png", "label": ["dog", "cat"][: 1 + i % 2], "caption": f"c{i}"} for i in range(4)
    ]
    lst = write_jsonl(tmp_path / "m.jsonl", entries)
    # without --multi-label a list is not a label
    with pytest.raises(ImgpackError, match=r'line 1: label \["dog"\] is neither'):
        scan_list(lst, images)
    scan = scan_list(lst, images, multi_label=",")
    assert scan.fields == {"caption": "str", "labels": "ints"}
    out = tmp_path / "ds"
    pack_folder(scan, out, "hdf5", workers=1, order="source")
    ds = open_dataset(out, fields=["labels", "caption"])
    assert ds[1][1] == {"label": -1, "labels": pytest.approx(np.array([1, 0])), "caption": "c1"}


@pytest.mark.parametrize("pad", [False, True])
def test_batch_collation_equals_collating_each_sample(pad):
    """FieldPlan.batch (boxes moved as one batch, ragged fields as one buffer) gives what the
    per-sample target of each sample, collated, gives: samples without boxes, boxes dropped by the
    crop or by min_visibility, missing values and flips included."""
    from readers.fields.boxes import geometry_for_window
    from readers.fields.field_schema import as_tensors, typed
    from readers.fields.sample_fields import FieldPlan
    from tests.readers.fields.test_boxes import random_batch

    schema = {"caption": "str", "boxes": "boxes", "categories": "box_ints", "score": "float", "tags": "ints"}
    rng = np.random.default_rng(3)
    boxes, geometries = random_batch(rng, 40)
    stored: list = []
    for i, b in enumerate(boxes):
        values = {"boxes": np.nan_to_num(b).tolist(), "categories": rng.integers(0, 80, len(b)).tolist()}
        if i % 3:
            values |= {"caption": f"caption {i}", "score": float(i), "tags": list(range(i % 4))}
        stored.append(typed(schema, values))
    stored[7] = None  # a record without stored fields
    geometries[7] = geometry_for_window((10, 10), (0, 0, 10, 10), (10, 10))
    names = ["caption", "boxes", "categories", "score", "tags", "geometry"]
    plan = FieldPlan(schema, names, pad=pad, min_visibility=0.4)
    got = as_tensors(plan.batch(stored, geometries))
    expected = as_tensors(plan.collate([plan.one(0, s, g) for s, g in zip(stored, geometries)], None))
    del expected["label"]
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[name], value), name
        elif value and isinstance(value[0], torch.Tensor):
            assert len(got[name]) == len(value), name
            assert all(torch.equal(a, b) for a, b in zip(got[name], value)), name
        else:
            assert got[name] == value, name
    counts = expected["boxes_count"].tolist() if pad else [len(b) for b in expected["boxes"]]
    assert 0 in counts and max(counts) > 0
