"""Scanning a COCO detection file (``instances_*.json``) into rows with boxes: ``pack coco``.

Each entry of ``images`` is one sample, its annotations its boxes. Fields (kinds of
``readers.fields``): ``boxes`` (COCO x, y, width, height in pixels, float32), ``categories`` (per
box, the index into the classes), ``iscrowd`` (per box, 0 or 1), ``image_id`` (COCO's id) and,
when the file has any, ``segmentation`` (JSON: per box COCO's polygons or RLE, None where the
annotation has none; ``readers.masks`` draws them as masks that follow the image).
The classes are the category names sorted by COCO category id.

The label rule: a sample's label is its class when all its boxes are of one category, else -1
(no boxes, or several categories); detection training reads ``categories``, the label only lets
single-object data serve classification as well.

Bad input never stops the scan: an annotation naming an image that is not in ``images``, a
category that is not in ``categories``, a malformed ``bbox`` or ``segmentation`` (or an RLE whose
size is not the image's), a NaN or infinite coordinate, and
an image whose file is missing under ``--root`` (checked by ``packer.rows``, with paths that
leave the root and repeated paths) are listed in ``skipped`` with the reason; a box
reaching outside its image (COCO's own ``width``/``height``) is clipped, and a box left without
area dropped; both are counted in ``clipped``. A file that is not COCO is one ``ImgpackError``
naming what is missing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.rows import Row, scan_rows
from packer.source import SourceScan
from readers.boxes import clip_boxes
from readers.errors import ImgpackError
from readers.masks import SEGMENTATION

SCHEMA = {"boxes": "boxes", "categories": "box_ints", "iscrowd": "box_ints", "image_id": "int"}
REQUIRED = {
    "images": ("id", "file_name"),
    "annotations": ("image_id", "bbox", "category_id"),
    "categories": ("id", "name"),
}


@dataclass
class CocoScan:
    rows: list[Row]  # paths are COCO's file_names, checked against --root by packer.rows
    classes: list[str]
    schema: dict[str, str]
    skipped: list[dict[str, str]] = field(default_factory=list)
    clipped: int = 0  # boxes clipped to their image (or dropped, left without area)
    empty: int = 0  # images without a box (kept, or dropped with skip_empty)


def load_coco(path: Path) -> dict[str, Any]:
    """The parsed file, checked for COCO's three lists and their keys (one line naming what lacks)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ImgpackError(f"{path}: no such COCO annotation file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ImgpackError(f"{path}: not a COCO annotation file (not JSON: {exc})") from None
    if not isinstance(data, dict):
        raise ImgpackError(
            f"{path}: not a COCO annotation file (a JSON object with images, annotations, categories)"
        )
    missing = [key for key in REQUIRED if not isinstance(data.get(key), list)]
    if missing:
        raise ImgpackError(f"{path}: not a COCO annotation file: no {' / '.join(missing)} list")
    for key in ("images", "categories"):  # annotations are checked one by one: a bad one is a skip
        for number, entry in enumerate(data[key]):
            lacking = [k for k in REQUIRED[key] if not isinstance(entry, dict) or k not in entry]
            if lacking:
                raise ImgpackError(
                    f"{path}: not a COCO annotation file: {key}[{number}] has no {', '.join(lacking)}"
                )
    return data


def _bbox(value: Any) -> list[float] | str:
    """[x, y, w, h] as floats, or the reason it cannot be one."""
    if not isinstance(value, list) or len(value) != 4:
        return f"bbox {json.dumps(value)[:60]} is not [x, y, width, height]"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return f"bbox {json.dumps(value)[:60]} holds a value that is not a number"
    box = [float(v) for v in value]
    if not all(math.isfinite(v) for v in box):
        return "bbox has a NaN or infinite coordinate"
    return box


def _segmentation(value: Any, image: Mapping[str, Any]) -> Any:
    """COCO polygons or RLE as stored (None without one), or the reason they cannot be used."""
    if value is None or value == []:
        return None
    if isinstance(value, list):
        for polygon in value:
            numbers = isinstance(polygon, list) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in polygon
            )
            if not numbers or len(polygon) < 6 or len(polygon) % 2:
                return "segmentation holds a polygon that is not [x0, y0, x1, y1, x2, y2, ...] numbers"
        return value
    if isinstance(value, dict) and isinstance(value.get("counts"), (list, str)):
        size = value.get("size")
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) for v in size)):
            return "segmentation RLE has no [height, width] size"
        stated = _image_size(image)
        if stated is not None and tuple(size) != stated:
            return f"segmentation RLE of size {size} for an image of {list(stated)} (height, width)"
        return value
    return f"segmentation {json.dumps(value)[:60]} is neither polygons nor an RLE"


def _image_size(image: Mapping[str, Any]) -> tuple[int, int] | None:
    """COCO's (height, width) of an image, when it states a usable one."""
    h, w = image.get("height"), image.get("width")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
        return h, w  # type: ignore[return-value]
    return None


def scan_coco(annotations: str | os.PathLike, skip_empty: bool = False) -> CocoScan:
    """The rows of a COCO file, in the order of its ``images`` list, with the annotations skipped
    (image files are checked by ``coco_source``)."""
    path = Path(annotations).expanduser()
    data = load_coco(path)
    try:
        categories = sorted(data["categories"], key=lambda c: c["id"])
    except TypeError:
        raise ImgpackError(f"{path}: not a COCO annotation file: category ids are not all numbers") from None
    index_of = {c["id"]: i for i, c in enumerate(categories)}
    classes = [str(c["name"]) for c in categories]
    images = {image["id"]: image for image in data["images"]}
    scan = CocoScan([], classes, dict(SCHEMA))
    boxes_of: dict[Any, list[tuple[list[float], int, int, Any]]] = {}
    for number, ann in enumerate(data["annotations"]):
        where = f"{path.name} annotations[{number}]"
        problem = _annotation_problem(ann, images, index_of)
        box = _bbox(ann.get("bbox")) if not problem else problem
        if isinstance(box, str):
            name = images.get(ann.get("image_id"), {}).get("file_name") if isinstance(ann, dict) else None
            scan.skipped.append({"path": str(name or f"<{where}>"), "reason": f"{where}: {box}"})
            continue
        segmentation = _segmentation(ann.get("segmentation"), images[ann["image_id"]])
        if isinstance(segmentation, str):
            name = images[ann["image_id"]].get("file_name")
            scan.skipped.append({"path": str(name or f"<{where}>"), "reason": f"{where}: {segmentation}"})
            continue
        if segmentation is not None:
            scan.schema[SEGMENTATION] = "json"
        crowd = 1 if ann.get("iscrowd") else 0
        entry = (box, index_of[ann["category_id"]], crowd, segmentation)
        boxes_of.setdefault(ann["image_id"], []).append(entry)
    for number, image in enumerate(data["images"]):
        found = boxes_of.get(image["id"], [])
        if not found:
            scan.empty += 1
            if skip_empty:
                continue
        scan.rows.append(_row(scan, image, found, f"{path.name} images[{number}]"))
    if not scan.rows:
        first = f"; first problem: {scan.skipped[0]['reason']}" if scan.skipped else ""
        raise ImgpackError(f"{path}: no image to pack ({len(scan.skipped)} skipped){first}")
    return scan


def _annotation_problem(ann: Any, images: Mapping[Any, Any], index_of: Mapping[Any, int]) -> str:
    if not isinstance(ann, dict):
        return "not a JSON object"
    lacking = [k for k in REQUIRED["annotations"] if k not in ann]
    if lacking:
        return f"no {', '.join(lacking)}"
    if ann["image_id"] not in images:
        return f"image_id {json.dumps(ann['image_id'])[:40]} is not in images"
    if ann["category_id"] not in index_of:
        return f"category_id {json.dumps(ann['category_id'])[:40]} is not in categories"
    return ""


def _inside(box: list[float], size: tuple[int, int] | None) -> bool:
    x, y, w, h = box
    return size is None or (x >= 0 and y >= 0 and w > 0 and h > 0 and x + w <= size[1] and y + h <= size[0])


def _row(scan: CocoScan, image: Mapping[str, Any], found: list, where: str) -> Row:
    boxes = [b for b, _, _, _ in found]
    categories = [c for _, c, _, _ in found]
    crowd = [k for _, _, k, _ in found]
    segmentations = [m for _, _, _, m in found]
    size = _image_size(image)
    if not all(_inside(box, size) for box in boxes):  # the rare image to clip: numpy only then
        clipped_boxes, kept, clipped = clip_boxes(np.array(boxes, np.float32), size)  # type: ignore[arg-type]
        boxes, scan.clipped = clipped_boxes.tolist(), scan.clipped + clipped
        categories, crowd = [categories[i] for i in kept.tolist()], [crowd[i] for i in kept.tolist()]
        segmentations = [segmentations[i] for i in kept.tolist()]
    distinct = set(categories)
    label = distinct.pop() if len(distinct) == 1 else -1
    fields = {
        "boxes": boxes,
        "categories": categories,
        "iscrowd": crowd,
        "image_id": image["id"] if isinstance(image["id"], int) else None,
    }
    if SEGMENTATION in scan.schema:  # the file has segmentations (rows are made after every annotation)
        fields[SEGMENTATION] = segmentations
    name = image["file_name"]
    return Row(name if isinstance(name, str) else "", label, fields, where)


def coco_source(
    annotations: str | os.PathLike, root: str | os.PathLike | None = None, skip_empty: bool = False
) -> SourceScan:
    """The ``SourceScan`` ``pack coco`` packs: ``scan_coco``'s rows through the rows entry point
    (``packer.rows.scan_rows``), the clipped-box count in the manifest's ``extra``."""
    path = Path(annotations).expanduser()
    base = Path(root).expanduser() if root is not None else path.parent
    if not base.is_dir():
        raise ImgpackError(
            f"{base}: --root is not a folder; give the folder COCO's file_names are relative to"
        )
    scan = scan_coco(path, skip_empty)
    extra = {
        "coco": str(path.resolve()),
        "boxes_clipped": str(scan.clipped),
        "images_without_boxes": str(scan.empty),
    }
    return scan_rows(scan.rows, base, scan.classes, scan.schema, scan.skipped, extra, where=str(path))
