"""Pack-time geometry: boxes are stored in the pixels of the STORED image, so when ``--resize`` /
``--crop`` change the image the packer moves its boxes through the same window (readers.fields.boxes).

Source boxes are in the file's raw pixel grid, as COCO tools read it (pycocotools and
torchvision's ``CocoDetection`` open images without applying EXIF, and COCO's ``width``/``height``
are the raw ones); the stored image is upright, so an EXIF-rotated source's boxes are turned with
it first (``orient_boxes``). A crop that drops boxes also recomputes a label derived from them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from packer.transform.preprocess import target_size
from readers.fields.boxes import SampleGeometry, geometry_for_resize_crop, identity_geometry, transform_boxes
from readers.fields.field_schema import encode
from readers.fields.masks import SEGMENTATION, orient_segmentations, refit_segmentations
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.image.geometry import centre_window

# EXIF orientation -> (x and y swapped, then x mirrored, then y mirrored): what the transpose that
# makes the image upright (preprocess.ORIENTATION_TRANSPOSE) does to a point of the raw grid.
ORIENTATION_MOVES = {
    2: (False, True, False),
    3: (False, True, True),
    4: (False, False, True),
    5: (True, False, False),
    6: (True, True, False),
    7: (True, True, True),
    8: (True, False, True),
}
CATEGORIES = "categories"  # the box_ints field holding each box's class (pack coco's label rule)


def orient_boxes(boxes: np.ndarray, orientation: int, upright: tuple[int, int]) -> np.ndarray:
    """(N, 4) xywh boxes in the raw pixel grid of a source with EXIF ``orientation`` -> xywh in its
    upright image of ``upright`` (width, height), as ``ImageOps.exif_transpose`` turns the pixels."""
    if orientation not in ORIENTATION_MOVES:
        return boxes
    swap, mirror_x, mirror_y = ORIENTATION_MOVES[orientation]
    x0, y0, w, h = np.asarray(boxes, np.float64).reshape(-1, 4).T
    x1, y1 = x0 + w, y0 + h
    if swap:
        x0, y0, x1, y1 = y0, x0, y1, x1
    width, height = upright
    if mirror_x:
        x0, x1 = width - x1, width - x0
    if mirror_y:
        y0, y1 = height - y1, height - y0
    return np.stack([x0, y0, x1 - x0, y1 - y0], axis=1).astype(np.float32)


def pack_geometry(original_size: tuple[int, int], spec: PreprocessSpec) -> SampleGeometry:
    """What ``preprocess_image`` does to an upright source of ``original_size`` (width, height,
    as ``PackedSample.original_size``): resize to ``target_size``, then the centre ``--crop``."""
    width, height = original_size
    if spec.encode == "original":
        return identity_geometry((height, width))
    out_w, out_h = target_size(width, height, spec)
    window = centre_window(out_h, out_w, (spec.crop, spec.crop)) if spec.crop else None
    return geometry_for_resize_crop((height, width), (out_h, out_w), window)


def refit_fields(
    fields: dict[str, Any], schema: Mapping[str, str], sample: PackedSample, spec: PreprocessSpec
) -> dict[str, Any]:
    """A sample's fields with its "boxes" turned upright and moved into the stored image's pixels,
    its "box_ints" filtered like them (a ``--crop`` can cut boxes away); ``fields`` itself when the
    pack kept the source's geometry. The part writer's hook (fields as ``readers.fields.field_schema``
    values)."""
    name = next((n for n, k in schema.items() if k == "boxes" and n in fields), None)
    geometry = pack_geometry(sample.original_size, spec)
    turned = sample.orientation in ORIENTATION_MOVES
    if name is None or (not turned and geometry == identity_geometry(geometry.stored)):
        return fields
    if geometry.out != (sample.height, sample.width):
        stored = f"{sample.height}x{sample.width}"
        raise RuntimeError(f"{sample.rel}: pack geometry {geometry.out} != stored {stored}")
    boxes = np.asarray(fields[name], np.float32).reshape(-1, 4)
    if turned:
        boxes = orient_boxes(boxes, sample.orientation, sample.original_size)
    boxes, kept = transform_boxes(boxes, geometry)
    out = {**fields, name: boxes.tolist()}
    for other, kind in schema.items():
        if kind == "box_ints" and other in out:
            out[other] = [out[other][i] for i in kept.tolist()]
    if isinstance(out.get(SEGMENTATION), list):  # per box, like the box_ints: turned and moved too
        segmentations = [out[SEGMENTATION][i] for i in kept.tolist()]
        if turned:
            moves = ORIENTATION_MOVES[sample.orientation]
            segmentations = orient_segmentations(segmentations, moves, sample.original_size)
        out[SEGMENTATION] = refit_segmentations(segmentations, geometry)
    return out


def label_of_categories(categories: Sequence[int]) -> int:
    """pack coco's label rule: the one category of all the boxes, else -1 (none, or several)."""
    distinct = set(categories)
    return distinct.pop() if len(distinct) == 1 else -1


def refit_packed(sample: PackedSample, schema: Mapping[str, str], spec: PreprocessSpec) -> PackedSample:
    """``sample`` with its stored fields (canonical JSON) refitted by ``refit_fields``: what the
    part writer stores. Samples without boxes, and packs that keep the geometry, pass unchanged.
    A label that followed the "categories" of the boxes by ``label_of_categories`` still does
    after a crop dropped some (else it would name a class no stored box has)."""
    width, height = sample.original_size
    kept_geometry = not spec.crop and (sample.height, sample.width) == (height, width)
    if not sample.fields or "boxes" not in schema.values():
        return sample
    if sample.orientation not in ORIENTATION_MOVES and (kept_geometry or sample.encoding == "original"):
        return sample
    values = json.loads(sample.fields)
    refit = refit_fields(values, schema, sample, spec)
    if refit is values:
        return sample
    sample.fields = encode(refit).decode()
    if schema.get(CATEGORIES) == "box_ints" and CATEGORIES in values:
        before, after = values[CATEGORIES], refit[CATEGORIES]
        if len(after) != len(before) and sample.label == label_of_categories(before):
            sample.label = label_of_categories(after)
    return sample

