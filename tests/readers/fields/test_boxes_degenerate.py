"""Issue 32 case 6: the degenerate-box rule and ``min_visibility`` as documented, on every path.

A box that only touches the crop window must not come back with a side of 1e-14 px (torchvision's
detection models refuse a box whose x2 <= x1 once it is float32), and a box keeping exactly
``min_visibility`` of its area is kept ("dropped when it keeps *less*").
"""

from __future__ import annotations

import numpy as np
import pytest

from packer.scan.rows import Row, pack_rows
from readers import make_loader, open_iterable
from readers.fields.boxes import geometry_for_window, transform_box_batch, transform_boxes
from tests.support.cocodata import draw_rectangles

MIN_SIDE = 0.01  # px, the documented rule (docs/reading.md)
# The window's left edge lands 1e-14 px left of the box's right edge (x = 50): what a
# RandomResizedCrop window computed in floating point gives when it starts at a box edge.
TOUCHING = geometry_for_window((100, 100), (0.0, 50.0 - 1e-14, 50.0, 50.0), (64, 64))
TOUCHING_BOX = np.array([[20.0, 20.0, 30.0, 30.0], [60.0, 10.0, 20.0, 20.0]], np.float32)
# Cut at its middle in decimal coordinates: the window starts at 85.1, the box spans 83.6..86.6.
HALF = geometry_for_window((500, 500), (0.0, 85.1, 146.3, 146.3), (168, 168))
HALF_BOX = np.array([[83.6, 10.0, 3.0, 7.0]], np.float32)


def test_a_box_touching_the_window_is_dropped_not_a_sliver():
    boxes, kept = transform_boxes(TOUCHING_BOX, TOUCHING)
    assert kept.tolist() == [1]
    xyxy = np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1).astype(np.float32)
    assert (xyxy[:, 2:] > xyxy[:, :2]).all()  # what torchvision's GeneralizedRCNN asserts
    assert (boxes[:, 2:] >= MIN_SIDE).all()


def test_the_batched_transform_follows_the_same_rule():
    moved = transform_box_batch([TOUCHING_BOX, HALF_BOX], [TOUCHING, HALF], 0.0)
    assert moved.counts.tolist() == [1, 1] and moved.keep.tolist() == [False, True, True]
    assert (moved.boxes[:, 2:] >= MIN_SIDE).all()


@pytest.mark.parametrize("move", ["one", "batch"])
def test_a_box_keeping_exactly_min_visibility_of_its_area_is_kept(move):
    if move == "one":
        _, kept = transform_boxes(HALF_BOX, HALF, min_visibility=0.5)
    else:
        kept = np.flatnonzero(transform_box_batch([HALF_BOX], [HALF], 0.5).keep)
    assert kept.tolist() == [0]
    _, kept = transform_boxes(HALF_BOX, HALF, min_visibility=0.51)
    assert kept.tolist() == []  # keeping less is still dropped


def test_read_paths_drop_boxes_that_only_touch_the_crop(tmp_path):
    """A 32 px centre crop of an 80 px wide image starts at x = 24: a box ending there touches it."""
    (tmp_path / "img").mkdir()
    images = draw_rectangles(tmp_path / "img", 4)
    touching = [[0.0, 20.0, 24.0 + 1e-6, 10.0], [30.0, 20.0, 8.0, 8.0]]  # float32: ends at 24.000001
    rows = [Row(f"{i:02d}.png", 0, {"boxes": touching}) for i in range(4)]
    out = tmp_path / "ds"
    pack_rows(rows, images, ["a"], out, "lmdb", {"boxes": "boxes"}, workers=1, order="source")
    sample = next(iter(open_iterable(out, crop=32, fields=["boxes"])))[1]["boxes"]
    batch = next(iter(make_loader(open_iterable(out, crop=32, batch_size=4, fields=["boxes"]))))[1]
    for boxes in [sample, *batch["boxes"]]:
        assert len(boxes) == 1 and (np.asarray(boxes)[:, 2:] >= MIN_SIDE).all()
