"""pack coco's scan: rows with boxes, categories, iscrowd and image ids from a COCO file, and every
kind of bad input recorded as a skip, a count or one clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from packer.coco import scan_coco
from readers.errors import ImgpackError
from tests.cocodata import CLASSES, colour_of, find_rectangle, iou, make_coco


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco")
    return make_coco(folder, count=40, empty=3)


def test_rows_frame_the_drawn_rectangles(coco):
    scan = scan_coco(coco, coco.parent / "images")
    assert scan.classes == CLASSES and not scan.skipped and scan.clipped == 0
    assert len(scan.rows) == 40 and scan.empty == 3
    assert scan.schema == {
        "boxes": "boxes",
        "categories": "box_ints",
        "iscrowd": "box_ints",
        "image_id": "int",
    }
    data = json.loads(coco.read_text())
    assert [r.fields["image_id"] for r in scan.rows] == [i["id"] for i in data["images"]]
    for row in scan.rows:
        pixels = np.asarray(Image.open(row.path).convert("RGB"))
        fields = row.fields
        assert len(fields["boxes"]) == len(fields["categories"]) == len(fields["iscrowd"])
        for box, category in zip(fields["boxes"], fields["categories"]):
            assert iou(box, find_rectangle(pixels, colour_of(category))) >= 0.95
        distinct = set(fields["categories"])
        assert row.label == (distinct.pop() if len(distinct) == 1 else -1)


def test_skip_empty_drops_images_without_boxes(coco):
    scan = scan_coco(coco, coco.parent / "images", skip_empty=True)
    assert len(scan.rows) == 37 and all(r.fields["boxes"] for r in scan.rows)


def _write(tmp_path, data) -> str:
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    (tmp_path / "a.jpg").write_bytes(b"x")
    (tmp_path / "b.jpg").write_bytes(b"x")
    return str(path)


def base():
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 50, "height": 40},
            {"id": 2, "file_name": "b.jpg", "width": 50, "height": 40},
            {"id": 3, "file_name": "missing.jpg", "width": 50, "height": 40},
        ],
        "annotations": [],
        "categories": [{"id": 5, "name": "cat"}, {"id": 2, "name": "dog"}],
    }


def test_bad_annotations_are_skips_and_counts(tmp_path):
    data = base()
    ann = [
        {"image_id": 1, "bbox": [10, 10, 10, 10], "category_id": 5},
        {"image_id": 1, "bbox": [40, 30, 30, 30], "category_id": 2},  # reaches outside: clipped
        {"image_id": 1, "bbox": [60, 50, 5, 5], "category_id": 2},  # wholly outside: dropped, counted
        {"image_id": 9, "bbox": [1, 1, 1, 1], "category_id": 5},  # no such image
        {"image_id": 2, "bbox": [1, 1, 1, 1], "category_id": 99},  # no such category
        {"image_id": 2, "bbox": [1, "x", 1, 1], "category_id": 5},
        {"image_id": 2, "bbox": [1, 1, 1], "category_id": 5},
        {"image_id": 2, "bbox": [float("nan"), 1, 1, 1], "category_id": 5},
        {"image_id": 2, "bbox": [1, 1, float("inf"), 1], "category_id": 5},
        {"image_id": 2, "category_id": 5},
        {"image_id": 3, "bbox": [1, 1, 1, 1], "category_id": 5},  # its file is missing
    ]
    data["annotations"] = ann
    scan = scan_coco(_write(tmp_path, data))
    assert scan.classes == ["dog", "cat"]  # sorted by category id
    reasons = [s["reason"] for s in scan.skipped]
    assert len(reasons) == 8, reasons
    assert any("image_id 9 is not in images" in r for r in reasons)
    assert any("category_id 99 is not in categories" in r for r in reasons)
    assert sum("NaN or infinite" in r for r in reasons) == 2
    assert any("no bbox" in r for r in reasons)
    assert any(s["path"] == "missing.jpg" and "file not found" in s["reason"] for s in scan.skipped)
    assert scan.clipped == 2
    first, second = scan.rows
    np.testing.assert_allclose(first.fields["boxes"], [[10, 10, 10, 10], [40, 30, 10, 10]])
    assert first.fields["categories"] == [1, 0] and first.label == -1
    assert second.fields["boxes"] == [] and second.label == -1


@pytest.mark.parametrize(
    "data, message",
    [
        ("[1, 2]", "a JSON object"),
        ("{not json", "not JSON"),
        ({"images": [], "categories": []}, "no annotations list"),
        ({"annotations": []}, "no images / categories list"),
        ({"images": [{"id": 1}], "annotations": [], "categories": []}, "images[0] has no file_name"),
        ({"images": [], "annotations": [], "categories": [{"id": 1}]}, "categories[0] has no name"),
    ],
)
def test_not_coco_is_one_line_naming_what_lacks(tmp_path, data, message):
    with pytest.raises(ImgpackError) as info:
        scan_coco(_write(tmp_path, data))
    text = str(info.value)
    assert message in text and "instances.json" in text and "\n" not in text


def test_outside_root_and_duplicates(tmp_path):
    data = base()
    data["images"] += [{"id": 4, "file_name": "../a.jpg"}, {"id": 5, "file_name": "./a.jpg"}]
    scan = scan_coco(_write(tmp_path, data))
    reasons = {s["path"]: s["reason"] for s in scan.skipped}
    assert "outside --root" in reasons["../a.jpg"]
    assert "the same file as images[0]" in reasons["a.jpg"]
