"""EXIF-rotated sources: the stored image is upright on every encoding, and the boxes turn with it.

The oracle: one upright picture (a red and a green rectangle on black), written as a JPEG for
each EXIF orientation 1-8 whose raw pixels are the upright ones transposed back (so Pillow's
``exif_transpose`` of every file gives the same upright picture). The COCO file describes each
file as pycocotools and torchvision's ``CocoDetection`` see it (neither applies EXIF): boxes
and ``width``/``height`` in the raw pixel grid. Every format, encoding and reading path must
return upright pixels whose rectangles the returned boxes frame (IoU >= 0.9).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageOps

from packer.cli import main
from packer.scan.rows import Row, pack_rows
from packer.transform.preprocess import ORIENTATION_TRANSPOSE
from readers import RandomResizedCrop, open_dataset, open_iterable
from readers.dali import dali_loader
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import CATEGORIES, coco_pack_args, colour_of, find_rectangle, iou

UPRIGHT = (96, 144)  # (h, w): not square, so orientations 5-8 change the shape
RECTANGLES = {0: (12, 10, 48, 32), 1: (88, 52, 36, 28)}  # class index -> upright (x, y, w, h)
# The transpose that undoes each orientation's (ROTATE_90 and ROTATE_270 undo each other).
UNDO = {o: t for o, t in ORIENTATION_TRANSPOSE.items() if o not in (6, 8)}
UNDO[6], UNDO[8] = ORIENTATION_TRANSPOSE[8], ORIENTATION_TRANSPOSE[6]
FIELDS = ["boxes", "categories"]
MIN_SIDE = 8  # a rectangle cut thinner than this by a crop is a sliver whose found edges blur


def upright_picture() -> np.ndarray:
    pixels = np.zeros((*UPRIGHT, 3), np.uint8)
    for index, (x, y, w, h) in RECTANGLES.items():
        pixels[y : y + h, x : x + w] = colour_of(index)
    return pixels


def write_rotated(folder, orientation: int) -> tuple[str, np.ndarray]:
    """A JPEG whose EXIF ``orientation`` makes it the upright picture; (name, raw pixels)."""
    upright = Image.fromarray(upright_picture())
    raw = upright.transpose(UNDO[orientation]) if orientation != 1 else upright
    exif = Image.Exif()
    exif[0x0112] = orientation
    name = f"o{orientation}.jpg"
    raw.save(folder / name, quality=95, exif=exif.tobytes())
    return name, np.asarray(raw)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exif")
    (folder / "images").mkdir()
    images, annotations = [], []
    ids = sorted(CATEGORIES)
    for orientation in range(1, 9):
        name, raw = write_rotated(folder / "images", orientation)
        with Image.open(folder / "images" / name) as img:  # the file is the upright picture
            assert img.getexif()[0x0112] == orientation
            upright = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
        for index, rect in RECTANGLES.items():
            assert find_rectangle(upright, colour_of(index)) == rect
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": orientation,
                    "category_id": ids[index],
                    "bbox": list(find_rectangle(raw, colour_of(index))),  # the raw grid
                    "iscrowd": 0,
                }
            )
        images.append({"id": orientation, "file_name": name, "height": raw.shape[0], "width": raw.shape[1]})
    categories = [{"id": i, "name": CATEGORIES[i][0]} for i in ids]
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def frames(image, target) -> int:
    """How many of the sample's boxes frame their rectangle in ``image`` (each must, unless a crop
    left only a sliver of it)."""
    pixels = np.asarray(image)
    if pixels.ndim == 3 and pixels.shape[0] == 3 and pixels.shape[2] != 3:
        pixels = pixels.transpose(1, 2, 0)
    framed = 0
    for box, category in zip(np.asarray(target["boxes"]).reshape(-1, 4), np.asarray(target["categories"])):
        found = find_rectangle(pixels, colour_of(int(category)))
        if found is None or min(found[2:]) < MIN_SIDE:
            assert min(box[2:]) < MIN_SIDE + 2, (box, found)
            continue
        assert iou(box, found) >= 0.9, (box, found)
        framed += 1
    return framed


PACKS = [(fmt, "jpeg", ()) for fmt in formats_storing_fields()] + [
    ("lmdb", "png", ()),
    ("tar", "original", ()),
    ("lmdb", "original", ()),
    ("tfrecord", "original", ()),
    ("hdf5", "raw", ("--resize", "80", "--resize-mode", "exact")),
    ("lmdb", "jpeg", ("--resize", "80", "--crop", "72")),
]


@pytest.mark.parametrize(("fmt", "encode", "more"), PACKS, ids=[f"{f}-{e}{'-'.join(m)}" for f, e, m in PACKS])
def test_every_path_reads_upright_pixels_and_boxes(coco, tmp_path, fmt, encode, more):
    out = tmp_path / "out"
    encoding = () if fmt == "bmp" else ("--encode", encode)
    args = coco_pack_args(coco, fmt, out, *encoding, *more, "--order", "source", "--workers", "1", "-q")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ds = open_dataset(out, decode="numpy", fields=FIELDS)
    assert len(ds) == 8
    framed = 0
    for index in range(8):
        image, target = ds[index]
        if not more:
            assert image.shape[:2] == UPRIGHT, (index + 1, image.shape)
        framed += frames(image, target)
    assert framed == 16
    reads = [
        {"crop": RandomResizedCrop(64, scale=(0.6, 1.0)), "flip": True, "seed": 2},
        {"resize": 80, "crop": 72, "batch_size": 4},
    ]
    for read in reads:
        framed = 0
        for images, target in open_iterable(out, fields=FIELDS, **read):
            if "batch_size" in read:
                for i in range(len(images)):
                    framed += frames(images[i], {k: target[k][i] for k in FIELDS})
            else:
                framed += frames(images, target)
        assert framed >= 12, (read, framed)
    if encode == "original" or fmt == "tar":  # DALI's own decoder (CPU) on the stored bytes too
        crop = RandomResizedCrop(64, scale=(0.6, 1.0))
        loader = dali_loader(out, batch_size=4, device="cpu", layout="HWC", seed=7, pad_last=False,
                             fields=FIELDS, crop=crop, flip=True)  # fmt: skip
        assert loader.backend == "dali-cpu"
        framed = 0
        for images, target in loader:
            framed += sum(frames(images[i], {k: target[k][i] for k in FIELDS}) for i in range(len(images)))
        assert framed >= 12, framed


def test_rows_sources_turn_their_boxes_too(coco, tmp_path):
    """Any rows source with a boxes field (imagelist, pack_rows) follows the same rule."""
    data = json.loads(coco.read_text())
    rows = []
    for image in data["images"]:
        anns = [a for a in data["annotations"] if a["image_id"] == image["id"]]
        fields = {"boxes": [a["bbox"] for a in anns], "categories": [0, 1]}
        rows.append(Row(image["file_name"], 0, fields))
    out = tmp_path / "rows.lmdb"
    schema = {"boxes": "boxes", "categories": "box_ints"}
    pack_rows(rows, coco.parent / "images", ["a"], out, "lmdb", schema, order="source", workers=1)
    ds = open_dataset(out, decode="numpy", fields=FIELDS)
    assert sum(frames(*ds[i]) for i in range(len(ds))) == 16
