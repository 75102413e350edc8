"""The tests' COCO set, boxes drawn into the pixels: packer/bench/coco_data.py (the docs' and the
benchmarks' generator too), under the names the tests import."""

from __future__ import annotations

from packer.bench.coco_data import (
    CATEGORIES,
    CLASSES,
    add_rectangle_polygons,
    coco_pack_args,
    colour_of,
    draw_rectangles,
    find_rectangle,
    iou,
    make_coco,
    rect_of,
)

__all__ = [
    "CATEGORIES",
    "CLASSES",
    "add_rectangle_polygons",
    "coco_pack_args",
    "colour_of",
    "draw_rectangles",
    "find_rectangle",
    "iou",
    "make_coco",
    "rect_of",
]
