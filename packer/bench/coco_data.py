"""A COCO detection set whose boxes are drawn into the pixels, so a test can find each box again.

Every image is a black canvas (JPEG or PNG, 40-120 pixels a side) with one or two solid
rectangles, one per category colour; the COCO file's boxes are exactly those rectangles. After any
resize, crop and flip, ``find_rectangle`` locates a category's colour in the output pixels, and
the box a reader returns must frame it (``iou``).

The tests' COCO data (tests/support/cocodata.py) and the docs' examples; from the command line::

    pack bench run coco_data coco --count 300    # coco/instances.json + coco/images/
    pack bench run coco_data coco --segmentation # each box's rectangle as a polygon too
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# category id -> (name, colour); ids deliberately not 0..n-1 nor in order, one name non-ASCII
CATEGORIES = {7: ("red", (255, 0, 0)), 3: ("green", (0, 255, 0)), 12: ("bleu clair é", (0, 0, 255))}
CLASSES = [CATEGORIES[i][0] for i in sorted(CATEGORIES)]  # the classes pack coco must produce


def coco_pack_args(coco: Path, fmt: str, out: Path, *more: str) -> list[str]:
    """``pack coco`` arguments for the set ``make_coco`` made: its JSON, images, ``--to fmt -o out``."""
    return ["coco", str(coco), "--root", str(coco.parent / "images"), "--to", fmt, "-o", str(out), *more]


def make_coco(folder: Path, count: int = 300, empty: int = 4, seed: int = 0) -> Path:
    """``count`` images under ``folder/images`` (the last ``empty`` without a box) and
    ``folder/instances.json``; returns the JSON's path."""
    rng = np.random.default_rng(seed)
    images_dir = folder / "images"
    (images_dir / "sub").mkdir(parents=True, exist_ok=True)
    images: list[dict] = []
    annotations: list[dict] = []
    ids = sorted(CATEGORIES)
    for number in range(count):
        h, w = (int(v) for v in rng.integers(40, 121, size=2))
        pixels = np.zeros((h, w, 3), np.uint8)
        boxes = 0 if number >= count - empty else int(rng.integers(1, 3))
        chosen = rng.choice(ids, size=boxes, replace=False)
        for slot, category in enumerate(chosen):
            # one rectangle per half of the width, so two never touch
            half = w // 2 if boxes == 2 else w
            bw = int(rng.integers(half // 2, half - 4 + 1))
            bh = int(rng.integers(h // 3, h - 4 + 1))
            x = slot * half + int(rng.integers(1, half - bw))
            y = int(rng.integers(1, h - bh))
            pixels[y : y + bh, x : x + bw] = CATEGORIES[int(category)][1]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": 1000 + number,
                    "category_id": int(category),
                    "bbox": [x, y, bw, bh],
                    "area": bw * bh,
                    "iscrowd": int(rng.random() < 0.1),
                }
            )
        png = number % 3 == 0
        name = f"{'sub/' if number % 5 == 0 else ''}img{number:04d}.{'png' if png else 'jpg'}"
        options: dict[str, Any] = {} if png else {"quality": 95}
        Image.fromarray(pixels).save(images_dir / name, **options)
        images.append({"id": 1000 + number, "file_name": name, "height": h, "width": w})
    categories = [{"id": i, "name": CATEGORIES[i][0], "supercategory": "shape"} for i in ids[::-1]]
    path = folder / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def find_rectangle(image: np.ndarray, colour: tuple[int, int, int]) -> tuple[int, int, int, int] | None:
    """xywh of the pixels of ``colour`` in an HWC (or CHW) uint8 image, None when none is left."""
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] == 3 and array.shape[2] != 3:
        array = array.transpose(1, 2, 0)
    on = np.ones(array.shape[:2], bool)
    for channel, value in enumerate(colour):
        on &= array[:, :, channel] > 127 if value else array[:, :, channel] < 100
    ys, xs = np.nonzero(on)
    if not len(xs):
        return None
    return int(xs.min()), int(ys.min()), int(xs.max() + 1 - xs.min()), int(ys.max() + 1 - ys.min())


def iou(a, b) -> float:
    """Intersection over union of two xywh boxes."""
    ax, ay, aw, ah = (float(v) for v in a)
    bx, by, bw, bh = (float(v) for v in b)
    w = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    h = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = w * h
    union = aw * ah + bw * bh - inter
    return inter / union if union > 0 else 0.0


def colour_of(category_index: int) -> tuple[int, int, int]:
    """The colour drawn for the class at ``category_index`` (an index into ``CLASSES``)."""
    return CATEGORIES[sorted(CATEGORIES)[category_index]][1]


def rect_of(i: int) -> tuple[int, int, int, int]:
    """(x, y, w, h) of the white rectangle ``draw_rectangles`` draws into image i."""
    return 5 + i % 7, 4 + i % 5, 20 + i % 9, 15 + i % 6


def draw_rectangles(root: Path, count: int, height: int = 60, width: int = 80) -> Path:
    """``count`` black PNGs ``00.png``... in ``root``, each with the white rectangle ``rect_of(i)``."""
    for i in range(count):
        pixels = np.zeros((height, width, 3), np.uint8)
        x, y, w, h = rect_of(i)
        pixels[y : y + h, x : x + w] = 255
        Image.fromarray(pixels).save(root / f"{i:02d}.png")
    return root


def add_rectangle_polygons(coco: Path) -> Path:
    """Give every annotation of a ``make_coco`` file its rectangle as a COCO polygon segmentation."""
    data = json.loads(coco.read_text())
    for ann in data["annotations"]:
        x, y, w, h = ann["bbox"]
        ann["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    coco.write_text(json.dumps(data))
    return coco


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--segmentation", action="store_true", help="rectangle polygons as segmentations")
    args = parser.parse_args()
    coco = make_coco(args.out, count=args.count, seed=args.seed)
    print(add_rectangle_polygons(coco) if args.segmentation else coco)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
