"""Scanning a COCO detection file (``instances_*.json``) into rows with boxes: ``pack coco``.

Each entry of ``images`` is one sample, its annotations its boxes. Fields (kinds of
``readers.fields.field_schema``): ``boxes`` (COCO x, y, width, height in pixels, float32), ``categories`` (per
box, the index into the classes), ``iscrowd`` (per box, 0 or 1), ``image_id`` (COCO's id) and,
when the file has any, ``segmentation`` (JSON: per box COCO's polygons or RLE, None where the
annotation has none; ``readers.fields.masks`` draws them as masks that follow the image).
The classes are the category names sorted by COCO category id.

The label rule: a sample's label is its class when all its boxes are of one category, else -1
(no boxes, or several categories), applied again when a pack-time ``--crop`` drops boxes;
detection training reads ``categories``, the label only lets single-object data serve
classification as well. Boxes and ``width``/``height`` are in the file's raw pixel grid, as
pycocotools and torchvision read them (without EXIF); an EXIF-rotated image is stored upright
and its boxes turned with it (``packer.transform.box_geometry``).

Bad input never stops the scan: an annotation naming an image that is not in ``images``, a
category that is not in ``categories``, an id that is ``true``/``false``, a malformed ``bbox`` or
``segmentation`` (or an RLE whose size is not the image's), a NaN or infinite coordinate, a box
without area (width or height <= 0), images sharing one id
(with their annotations: which image they describe is unknown) and an image whose file is
missing under ``--root`` (checked by ``packer.scan.rows``, with paths that leave the root and repeated
paths) are listed in ``skipped`` with the reason; two categories sharing an id are an error. A box
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

from packer.scan.rows import Row, scan_rows
from packer.sources.source import SourceScan
from packer.transform.box_geometry import label_of_categories
from readers.errors import ImgpackError
from readers.fields.boxes import clip_boxes
from readers.fields.masks import SEGMENTATION

SCHEMA = {"boxes": "boxes", "categories": "box_ints", "iscrowd": "box_ints", "image_id": "int"}
REQUIRED = {
    "images": ("id", "file_name"),
    "annotations": ("image_id", "bbox", "category_id"),
    "categories": ("id", "name"),
}


@dataclass
class CocoScan:
    rows: list[Row]  # paths are COCO's file_names, checked against --root by packer.scan.rows
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
    except RecursionError:
        raise ImgpackError(f"{path}: not a COCO annotation file (JSON nested too deeply)") from None
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
    if box[2] <= 0 or box[3] <= 0:
        return f"bbox {json.dumps(value)[:60]} has no area (a width or height of 0 or less)"
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
    _check_category_ids(path, data["categories"])
    index_of = {c["id"]: i for i, c in enumerate(categories)}
    classes = [str(c["name"]) for c in categories]
    images, shared = _images_by_id(data["images"])
    scan = CocoScan([], classes, dict(SCHEMA))
    boxes_of: dict[Any, list[tuple[list[float], int, int, Any]]] = {}
    for number, ann in enumerate(data["annotations"]):
        where = f"{path.name} annotations[{number}]"
        if isinstance(ann, dict) and _among(ann.get("image_id"), shared):
            shared[ann["image_id"]] += 1  # its image is skipped: the reason counts its annotations
            continue
        problem = _annotation_problem(ann, images, index_of)
        box = _bbox(ann.get("bbox")) if not problem else problem
        if isinstance(box, str):
            known = isinstance(ann, dict) and _is_id(ann.get("image_id"))
            name = images.get(ann["image_id"], {}).get("file_name") if known else None
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
        where = f"{path.name} images[{number}]"
        problem = _image_problem(image, images, shared)
        if problem:
            scan.skipped.append({"path": str(image.get("file_name")), "reason": f"{where}: {problem}"})
            continue
        found = boxes_of.get(image["id"], [])
        if not found:
            scan.empty += 1
            if skip_empty:
                continue
        scan.rows.append(_row(scan, image, found, where))
    if not scan.rows:
        first = f"; first problem: {scan.skipped[0]['reason']}" if scan.skipped else ""
        raise ImgpackError(f"{path}: no image to pack ({len(scan.skipped)} skipped){first}")
    return scan


def _is_id(value: Any) -> bool:
    """Whether ``value`` can be a COCO id, a number or a text: JSON's true/false cannot (Python
    counts true as 1), nor a list or an object (they cannot key the images or categories)."""
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _among(value: Any, ids: Mapping[Any, Any]) -> bool:
    """Whether ``value`` is an id of ``ids`` (never for true/false, nor a list or an object)."""
    try:
        return _is_id(value) and value in ids
    except TypeError:  # unhashable: not an id (the annotation's own check says so)
        return False


def _check_category_ids(path: Path, categories: list[dict[str, Any]]) -> None:
    """One error for a category id that is a boolean or repeats: either would give annotations a
    class nobody chose (pycocotools keeps the last of a repeated id)."""
    first: dict[Any, int] = {}
    for number, category in enumerate(categories):
        cid = category["id"]
        if not _is_id(cid):
            raise ImgpackError(f"{path}: categories[{number}] has id {json.dumps(cid)}, not a number")
        if cid in first:
            raise ImgpackError(
                f"{path}: categories[{first[cid]}] and categories[{number}] share id {json.dumps(cid)[:40]}, "
                "so which class its annotations name is ambiguous; give each category its own id"
            )
        first[cid] = number


def _images_by_id(entries: list[dict[str, Any]]) -> tuple[dict[Any, dict[str, Any]], dict[Any, int]]:
    """The images by id, without the ids several images share (whose annotations cannot be told
    apart), and those shared ids (-> annotations counted for the skip reason)."""
    images: dict[Any, dict[str, Any]] = {}
    shared: dict[Any, int] = {}
    for image in entries:
        iid = image["id"]
        if not _is_id(iid):
            continue
        if iid in images or iid in shared:
            shared[iid] = 0
            images.pop(iid, None)
        else:
            images[iid] = image
    return images, shared


def _image_problem(image: dict[str, Any], images: Mapping[Any, Any], shared: Mapping[Any, int]) -> str:
    if not _is_id(image["id"]):
        return f"id {json.dumps(image['id'])} is not an image id (a number or a text)"
    if image["id"] in shared:
        count = shared[image["id"]]
        return (
            f"id {json.dumps(image['id'])[:40]} is shared with another image, so its {count} annotations "
            "cannot be told apart; give each image its own id"
        )
    return ""


def _annotation_problem(ann: Any, images: Mapping[Any, Any], index_of: Mapping[Any, int]) -> str:
    if not isinstance(ann, dict):
        return "not a JSON object"
    lacking = [k for k in REQUIRED["annotations"] if k not in ann]
    if lacking:
        return f"no {', '.join(lacking)}"
    for key in ("image_id", "category_id"):
        if not _is_id(ann[key]):
            shown = json.dumps(ann[key])[:40]
            return f"{key} {shown} is not an id (a number or a text; true/false is not one)"
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
    label = label_of_categories(categories)
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
    (``packer.scan.rows.scan_rows``), the clipped-box count in the manifest's ``extra``."""
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
