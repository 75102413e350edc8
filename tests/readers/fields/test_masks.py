"""COCO segmentations: ``pack coco`` keeps them, ``masks=True`` returns masks that follow the image.

Each generated image has a triangle (a polygon annotation) and an ellipse (an RLE crowd annotation,
compressed or as a counts list) drawn in their category's colour; after a pack-time resize and
crop, then a read-time RandomResizedCrop and flip, every returned mask must cover the pixels of its
colour in the returned image (IoU >= 0.9), on the per-sample, batch and map-style paths.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from pycocotools import mask as coco_mask  # the reference mask decoder (imgpack[all] installs it)

from packer.cli import main
from packer.sources.coco import scan_coco
from readers import RandomResizedCrop, open_dataset, open_iterable
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import CATEGORIES, colour_of

MIN_AREA = 60  # masks smaller than this in the output are slivers whose colour edges blur


def counts_list(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts: column-major runs, starting with a run of zeros."""
    flat = mask.reshape(-1, order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(flat)]])).tolist()
    return runs if flat[0] == 0 else [0, *runs]


def inside_triangle(x: np.ndarray, y: np.ndarray, tri: list[float]) -> np.ndarray:
    """Which points (pixel centres) lie inside the triangle: the exact drawing of its polygon."""
    x0, y0, x1, y1, x2, y2 = tri
    sides = [(bx - ax) * (y - ay) - (by - ay) * (x - ax) for ax, ay, bx, by in
             [(x0, y0, x1, y1), (x1, y1, x2, y2), (x2, y2, x0, y0)]]  # fmt: skip
    return np.all([s >= 0 for s in sides], axis=0) | np.all([s <= 0 for s in sides], axis=0)


def annotation(number: int, image: int, category: int, crowd: int, box: list, segmentation) -> dict:
    keys = ("id", "image_id", "category_id", "iscrowd", "bbox", "segmentation")
    return dict(zip(keys, (number, image, category, crowd, box, segmentation)))


def make_shapes(folder, count: int = 24):
    """``count`` PNGs with a triangle and an ellipse, and their COCO file with segmentations."""
    rng = np.random.default_rng(5)
    (folder / "images").mkdir()
    ids = sorted(CATEGORIES)
    images, annotations = [], []
    for number in range(count):
        h, w = int(rng.integers(80, 121)), int(rng.integers(90, 131))
        half = w // 2
        tri = [float(rng.integers(2, 8)), float(rng.integers(2, 12)), float(half - 3), float(h // 2),
               float(rng.integers(4, 12)), float(h - 3)]  # fmt: skip
        pixels = np.zeros((h, w, 3), np.uint8)
        yy, xx = np.mgrid[0:h, 0:w]
        pixels[inside_triangle(xx + 0.5, yy + 0.5, tri)] = CATEGORIES[ids[0]][1]
        cy, cx, ry, rx = h / 2, half + w / 4, h / 2 - 6, w / 4 - 5
        ellipse = (((yy + 0.5 - cy) / ry) ** 2 + ((xx + 0.5 - cx) / rx) ** 2 <= 1).astype(np.uint8)
        pixels[ellipse > 0] = CATEGORIES[ids[1]][1]
        Image.fromarray(pixels).save(folder / "images" / f"{number:03d}.png")
        xs, ys = tri[0::2], tri[1::2]
        tri_box = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
        annotations.append(annotation(len(annotations) + 1, number, ids[0], 0, tri_box, [tri]))
        if number % 2:
            rle = coco_mask.encode(np.asfortranarray(ellipse))
            segmentation = {"size": [h, w], "counts": rle["counts"].decode()}
        else:
            segmentation = {"size": [h, w], "counts": counts_list(ellipse)}
        ys_e, xs_e = np.nonzero(ellipse)
        box = [
            int(xs_e.min()),
            int(ys_e.min()),
            int(xs_e.max() + 1 - xs_e.min()),
            int(ys_e.max() + 1 - ys_e.min()),
        ]
        annotations.append(annotation(len(annotations) + 1, number, ids[1], 1, box, segmentation))
        images.append({"id": number, "file_name": f"{number:03d}.png", "height": h, "width": w})
    categories = [{"id": i, "name": CATEGORIES[i][0]} for i in ids]
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("shapes"))


# Every format that stores fields, resized and cropped at pack time (the masks follow both the
# pack's and the read's geometry); the first of them also as it is.
FORMATS = formats_storing_fields()
PACKS = {
    **{f"{fmt}-resized": (fmt, ["--resize", "72", "--crop", "68"]) for fmt in FORMATS},
    f"{FORMATS[0]}-plain": (FORMATS[0], []),
}


@pytest.fixture(scope="module")
def packed(shapes):
    out = {}
    for name, (fmt, more) in PACKS.items():
        dest = shapes.parent / name
        args = [
            "coco",
            str(shapes),
            "--root",
            str(shapes.parent / "images"),
            "--to",
            fmt,
            "-o",
            str(dest),
            *more,
        ]
        result = CliRunner().invoke(main, [*args, "--workers", "1", "-q"])
        assert result.exit_code == 0, result.output
        out[name] = dest
    return out


def colour_region(image, category_index: int) -> np.ndarray:
    """The pixels of the category's colour in a CHW float image in [0, 1]."""
    pixels = (np.asarray(image) * 255).round().astype(np.uint8).transpose(1, 2, 0)
    on = np.ones(pixels.shape[:2], bool)
    for channel, value in enumerate(colour_of(category_index)):
        on &= pixels[:, :, channel] > 127 if value else pixels[:, :, channel] < 100
    return on


def check_masks(image, target) -> int:
    masks = np.asarray(target["masks"])
    assert masks.dtype == np.uint8 and masks.shape == (len(target["boxes"]), *image.shape[-2:])
    compared = 0
    for mask, label in zip(masks, np.asarray(target["labels"]).tolist()):
        region = colour_region(image, label - 1)
        if region.sum() < MIN_AREA:
            continue
        on = mask > 0
        iou = (on & region).sum() / (on | region).sum()
        assert iou >= 0.9, (label, iou, on.sum(), region.sum())
        compared += 1
    return compared


def test_pack_coco_keeps_segmentation_per_box(shapes):
    scan = scan_coco(shapes)
    assert scan.schema["segmentation"] == "json" and not scan.skipped
    first = scan.rows[0].fields
    assert len(first["segmentation"]) == len(first["boxes"]) == 2
    assert isinstance(first["segmentation"][0], list) and "counts" in first["segmentation"][1]


@pytest.mark.parametrize("name", PACKS)
def test_masks_follow_random_resized_crop_and_flip(packed, name):
    read = {
        "crop": RandomResizedCrop(64, scale=(0.4, 1.0)),
        "flip": True,
        "target": "torchvision",
        "masks": True,
    }
    compared = 0
    for image, target in open_iterable(packed[name], seed=2, **read):
        compared += check_masks(image, target)
    batched = list(open_iterable(packed[name], seed=2, batch_size=6, **read))
    for images, targets in batched:
        for image, target in zip(images, targets):
            compared += check_masks(image, target)
    assert compared >= 50


def test_map_style_masks_cover_the_stored_shapes(packed):
    ds = open_dataset(packed[f"{FORMATS[-1]}-resized"], target="torchvision", masks=True)
    assert sum(check_masks(*ds[i]) for i in range(len(ds))) >= 40


def test_a_malformed_segmentation_is_a_skip_with_the_reason(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    data = {
        "images": [{"id": 1, "file_name": "a.png", "width": 10, "height": 10}],
        "categories": [{"id": 1, "name": "x"}],
        "annotations": [
            {"image_id": 1, "bbox": [1, 1, 2, 2], "category_id": 1, "segmentation": [[1, 2, 3]]},
            {
                "image_id": 1,
                "bbox": [1, 1, 2, 2],
                "category_id": 1,
                "segmentation": {"counts": "ab", "size": [5, 5]},
            },
            {"image_id": 1, "bbox": [1, 1, 2, 2], "category_id": 1, "segmentation": "nope"},
            {"image_id": 1, "bbox": [1, 1, 2, 2], "category_id": 1, "segmentation": [[1, 1, 4, 1, 4, 4]]},
        ],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    scan = scan_coco(path)
    reasons = [s["reason"] for s in scan.skipped]
    assert len(reasons) == 3 and "not [x0, y0" in reasons[0] and "size [5, 5]" in reasons[1]
    assert "neither polygons nor an RLE" in reasons[2]
    assert scan.rows[0].fields["segmentation"] == [[[1, 1, 4, 1, 4, 4]]]


@pytest.mark.parametrize("more", [[], ["--resize", "80"]])
def test_masks_of_exif_rotated_sources_are_turned_with_the_pixels(tmp_path, more):
    from tests.readers.fields.test_exif_boxes import RECTANGLES, write_rotated

    (tmp_path / "images").mkdir()
    images, annotations = [], []
    ids = sorted(CATEGORIES)
    for orientation in range(1, 9):
        name, raw = write_rotated(tmp_path / "images", orientation)
        h, w = raw.shape[:2]
        for index in RECTANGLES:
            on = np.ones((h, w), bool)
            for channel, value in enumerate(colour_of(index)):
                on &= raw[:, :, channel] > 127 if value else raw[:, :, channel] < 100
            ys, xs = np.nonzero(on)
            box = [int(xs.min()), int(ys.min()), int(xs.max() + 1 - xs.min()), int(ys.max() + 1 - ys.min())]
            x, y, bw, bh = box
            polygon = [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]
            # one class as a polygon, the other as an RLE: both in the raw grid, as COCO tools see it
            rle = coco_mask.encode(np.asfortranarray(on.astype(np.uint8)))
            segmentation = polygon if index == 0 else {"size": [h, w], "counts": rle["counts"].decode()}
            annotations.append(
                annotation(len(annotations) + 1, orientation, ids[index], 0, box, segmentation)
            )
        images.append({"id": orientation, "file_name": name, "height": h, "width": w})
    path = tmp_path / "instances.json"
    categories = [{"id": i, "name": CATEGORIES[i][0]} for i in ids]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    args = ["coco", str(path), "--root", str(tmp_path / "images"), "--to", "lmdb", "-o", str(tmp_path / "d")]
    result = CliRunner().invoke(main, [*args, "--workers", "1", "-q", *more])
    assert result.exit_code == 0, result.output
    ds = open_dataset(tmp_path / "d", target="torchvision", masks=True)
    assert sum(check_masks(*ds[i]) for i in range(len(ds))) == 16
