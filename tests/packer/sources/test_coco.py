"""pack coco's scan: rows with boxes, categories, iscrowd and image ids from a COCO file, and every
kind of bad input recorded as a skip, a count or one clear error."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from packer.sources.coco import coco_source, scan_coco
from readers.errors import ImgpackError
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import CLASSES, coco_pack_args, colour_of, find_rectangle, iou, make_coco


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco")
    return make_coco(folder, count=40, empty=3)


def test_rows_frame_the_drawn_rectangles(coco):
    scan = scan_coco(coco)
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
        pixels = np.asarray(Image.open(coco.parent / "images" / row.path).convert("RGB"))
        fields = row.fields
        assert len(fields["boxes"]) == len(fields["categories"]) == len(fields["iscrowd"])
        for box, category in zip(fields["boxes"], fields["categories"]):
            assert iou(box, find_rectangle(pixels, colour_of(category))) >= 0.95
        distinct = set(fields["categories"])
        assert row.label == (distinct.pop() if len(distinct) == 1 else -1)


def test_skip_empty_drops_images_without_boxes(coco):
    scan = scan_coco(coco, skip_empty=True)
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
    scan = coco_source(_write(tmp_path, data))
    assert scan.classes == ["dog", "cat"]  # sorted by category id
    reasons = [s["reason"] for s in scan.skipped]
    assert len(reasons) == 8, reasons
    assert any("image_id 9 is not in images" in r for r in reasons)
    assert any("category_id 99 is not in categories" in r for r in reasons)
    assert sum("NaN or infinite" in r for r in reasons) == 2
    assert any("no bbox" in r for r in reasons)
    assert any(s["path"] == "missing.jpg" and "file not found" in s["reason"] for s in scan.skipped)
    assert scan.extra["boxes_clipped"] == "2" and scan.fields["categories"] == "box_ints"
    first, second = scan.items
    assert (first.rel, second.rel) == ("a.jpg", "b.jpg") and first.label == second.label == -1
    fields = json.loads(first.fields)
    np.testing.assert_allclose(fields["boxes"], [[10, 10, 10, 10], [40, 30, 10, 10]])
    assert fields["categories"] == [1, 0] and fields["image_id"] == 1
    assert json.loads(second.fields)["boxes"] == []


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
        coco_source(_write(tmp_path, data))
    text = str(info.value)
    assert message in text and "instances.json" in text and "\n" not in text


def test_outside_root_and_duplicates(tmp_path):
    data = base()
    data["images"] += [{"id": 4, "file_name": "../a.jpg"}, {"id": 5, "file_name": "./a.jpg"}]
    scan = coco_source(_write(tmp_path, data))
    reasons = {s["path"]: s["reason"] for s in scan.skipped}
    assert "outside --root" in reasons["../a.jpg"]
    assert "duplicate of" in reasons["a.jpg"] and "images[4]" in reasons["a.jpg"]
    assert [item.rel for item in scan.items] == ["a.jpg", "b.jpg"]


def _stored_boxes_frame_rectangles(out, spec_crop: int | None) -> int:
    """Every stored sample's boxes frame their rectangles in the stored pixels; returns the count
    of boxes checked."""
    from readers.formats import open_reader
    from readers.image.decode import decode_array

    reader = open_reader(out)
    checked = 0
    try:
        for index in range(len(reader)):
            record = reader.read(index)
            pixels = decode_array(record)
            if spec_crop:
                assert pixels.shape[:2] == (spec_crop, spec_crop)
            fields = record.fields
            assert fields["boxes"].dtype == np.float32 and len(fields["categories"]) == len(fields["boxes"])
            for box, category in zip(fields["boxes"], fields["categories"]):
                found = find_rectangle(pixels, colour_of(int(category)))
                if found is None:  # the crop left a sliver the JPEG washed out
                    assert box[2] * box[3] < 6
                    continue
                assert iou(box, found) >= 0.85, (index, box, found)
                checked += 1
    finally:
        reader.close()
    return checked


@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_pack_coco_cli_moves_boxes_with_resize_and_crop(coco, tmp_path, fmt):
    out = tmp_path / f"out-{fmt}"
    args = coco_pack_args(coco, fmt, out, "--resize", "48", "--crop", "40", "--workers", "1", "-q")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == CLASSES and manifest["num_samples"] == 40
    assert _stored_boxes_frame_rectangles(out, 40) >= 30


def test_pack_workers_move_the_boxes_with_the_pixels(coco, tmp_path):
    """The boxes are refitted where the image is resized (``preprocess_chunk`` in a pack worker),
    once: a pool of two workers stores exactly what the in-process pack stores."""
    from packer.engine.pack_run import pack_folder
    from packer.engine.parts import preprocess_chunk
    from readers.formats import open_reader
    from readers.formats.packed_sample import PreprocessSpec

    scan = coco_source(coco, coco.parent / "images")
    spec = PreprocessSpec(resize=48, crop=40)
    sample = next(s for s in preprocess_chunk(scan.items[:4], spec, schema=scan.fields) if s.fields)
    item = next(i for i in scan.items if i.index == sample.source_index)
    assert sample.fields != item.fields  # moved into the 40x40 stored pixels in the worker
    outs = {}
    for workers in (1, 2):
        outs[workers] = tmp_path / f"w{workers}"
        pack_folder(scan, outs[workers], "lmdb", spec, workers=workers)
        assert _stored_boxes_frame_rectangles(outs[workers], 40) >= 30
    one, two = open_reader(outs[1]), open_reader(outs[2])
    try:
        for index in range(len(one)):
            a, b = one.read(index).fields, two.read(index).fields
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    finally:
        one.close()
        two.close()


def test_ambiguous_ids_and_empty_boxes_are_skips_naming_the_reason(tmp_path):
    """Issue 32: two images sharing an id both got its boxes, ``category_id: true`` was category
    1, and a box of negative width on an image without a stated size was kept."""
    data = base()
    data["images"] = [
        {"id": 1, "file_name": "a.jpg"},  # no width/height: nothing to clip against
        {"id": 2, "file_name": "b.jpg", "width": 50, "height": 40},
        {"id": 2, "file_name": "c.jpg", "width": 50, "height": 40},  # shares b's id
        {"id": True, "file_name": "d.jpg"},
    ]
    (tmp_path / "c.jpg").write_bytes(b"x")
    (tmp_path / "d.jpg").write_bytes(b"x")
    data["categories"] = [{"id": 1, "name": "one"}, {"id": 5, "name": "cat"}]
    data["annotations"] = [
        {"image_id": 1, "bbox": [10, 10, 10, 10], "category_id": 5},
        {"image_id": 1, "bbox": [30, 10, -8, 10], "category_id": 5},  # negative width
        {"image_id": 1, "bbox": [30, 10, 8, 0], "category_id": 5},  # no height
        {"image_id": 1, "bbox": [1, 1, 5, 5], "category_id": True},  # not category 1
        {"image_id": True, "bbox": [1, 1, 5, 5], "category_id": 1},  # not image 1
        {"image_id": 2, "bbox": [1, 1, 5, 5], "category_id": 1},  # b's or c's?
        {"image_id": 2, "bbox": [3, 3, 5, 5], "category_id": 5},
    ]
    scan = coco_source(_write(tmp_path, data))
    reasons = {s["reason"] for s in scan.skipped}
    assert [item.rel for item in scan.items] == ["a.jpg"]
    fields = json.loads(scan.items[0].fields)
    assert fields["boxes"] == [[10, 10, 10, 10]] and fields["categories"] == [1]
    assert sum("has no area" in r for r in reasons) == 2
    assert any("category_id true is not an id" in r for r in reasons)
    assert any("image_id true is not an id" in r for r in reasons)
    by_path = {s["path"]: s["reason"] for s in scan.skipped}
    for name in ("b.jpg", "c.jpg"):
        assert "shared with another image" in by_path[name] and "its 2 annotations" in by_path[name]
    assert "not an image id" in by_path["d.jpg"]


@pytest.mark.parametrize(
    "categories, message",
    [
        ([{"id": 2, "name": "dog"}, {"id": 2, "name": "cat"}], "categories[0] and categories[1] share id 2"),
        ([{"id": True, "name": "dog"}], "categories[0] has id true, not a number"),
    ],
)
def test_ambiguous_category_ids_are_one_clear_error(tmp_path, categories, message):
    data = base()
    data["categories"] = categories
    data["annotations"] = [{"image_id": 1, "bbox": [1, 1, 5, 5], "category_id": 2}]
    with pytest.raises(ImgpackError) as info:
        coco_source(_write(tmp_path, data))
    assert message in str(info.value) and "instances.json" in str(info.value)


CROPPED = {"both": 0, "left": -1, "centre": 0}  # labels after --crop 40: green alone, nothing, green


def cropped_coco(tmp_path):
    """Three 100x60 images under batch1/: boxes at the left edge (category 7, cut by a --crop 40,
    which keeps x 30..70), in the centre (category 3), or both."""
    images_dir = tmp_path / "images" / "batch1"
    images_dir.mkdir(parents=True)
    left, centre = [1, 10, 10, 30], [45, 15, 12, 30]
    boxes = {"both": [(left, 7), (centre, 3)], "left": [(left, 7)], "centre": [(centre, 3)]}
    images, annotations = [], []
    for number, (name, found) in enumerate(boxes.items()):
        Image.fromarray(np.zeros((60, 100, 3), np.uint8)).save(images_dir / f"{name}.png")
        images.append({"id": number, "file_name": f"batch1/{name}.png", "width": 100, "height": 60})
        for box, category in found:
            ann = {"id": len(annotations), "image_id": number, "bbox": box, "category_id": category}
            annotations.append(ann)
    coco = tmp_path / "instances.json"
    categories = [{"id": 3, "name": "green"}, {"id": 7, "name": "red"}]
    coco.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return coco


def pack_cropped(tmp_path, fmt):
    out = tmp_path / fmt
    args = coco_pack_args(cropped_coco(tmp_path / "src"), fmt, out, "--crop", "40", "--order", "source", "-q")
    result = CliRunner().invoke(main, [*args, "--encode", "png"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_a_crop_that_drops_boxes_recomputes_the_label(tmp_path, fmt):
    """Issue 32: the label (one category, else -1) described boxes a pack-time --crop had cut."""
    from readers import open_dataset

    ds = open_dataset(pack_cropped(tmp_path, fmt), fields=["categories"])
    assert {name: ds[i][1]["label"] for i, name in enumerate(CROPPED)} == CROPPED
    assert [ds[i][1]["categories"].tolist() for i in range(3)] == [[0], [], [0]]


def test_tar_json_class_is_the_label_class_not_the_folder(tmp_path):
    out = pack_cropped(tmp_path, "tar")
    with tarfile.open(next(out.glob("*.tar"))) as archive:
        metas = [json.load(archive.extractfile(m)) for m in archive.getmembers() if m.name.endswith(".json")]
    assert [m["class"] for m in metas] == ["green", None, "green"]
    assert [m["label"] for m in metas] == list(CROPPED.values())
