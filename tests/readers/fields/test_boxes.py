"""readers.fields.boxes: boxes follow the image through resize, crop windows and flips (and the packer's
--resize/--crop), checked against rectangles drawn into real pixels and resampled for real."""

from __future__ import annotations

import numpy as np
import pytest

from packer.transform.box_geometry import pack_geometry
from packer.transform.preprocess import preprocess_image
from readers.fields.boxes import (
    SampleGeometry,
    clip_boxes,
    geometry_for_resize_crop,
    geometry_for_window,
    identity_geometry,
    transform_box_batch,
    transform_boxes,
)
from readers.formats.packed_sample import PreprocessSpec
from readers.image import resample
from readers.image.geometry import RandomResizedCrop, Window, centre_window, resized_size, sample_uniforms
from tests.support.cocodata import iou


def drawn_image(h: int, w: int, box) -> np.ndarray:
    image = np.zeros((h, w, 3), np.uint8)
    x, y, bw, bh = box
    image[y : y + bh, x : x + bw] = (255, 40, 0)
    return image


def found_box(image: np.ndarray):
    """xywh of the pixels of the drawn colour (red channel above half)."""
    ys, xs = np.nonzero(image[:, :, 0] > 127)
    return (xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min())


def apply(image: np.ndarray, geometry: SampleGeometry) -> np.ndarray:
    top, left, h, w = (int(v) for v in geometry.window)
    out = resample.resize(image[top : top + h, left : left + w], geometry.out)
    return out[:, ::-1] if geometry.flip else out


def test_identity_keeps_boxes_and_order():
    boxes = np.array([[1, 2, 3, 4], [10, 10, 5, 5]], np.float32)
    out, kept = transform_boxes(boxes, identity_geometry((40, 60)))
    assert out.dtype == np.float32 and kept.dtype == np.int64
    np.testing.assert_allclose(out, boxes)
    assert kept.tolist() == [0, 1]


def test_scale_and_shift_exact():
    # a window (top 10, left 20, 50x100) of a 100x200 image resized to 25x50: scale 0.5
    geometry = geometry_for_window((100, 200), (10, 20, 50, 100), (25, 50))
    out, _ = transform_boxes(np.array([[40, 30, 20, 10]], np.float32), geometry)
    np.testing.assert_allclose(out, [[10, 10, 10, 5]])


def test_flip_mirrors_about_the_output_width():
    geometry = geometry_for_window((10, 100), (0, 0, 10, 100), (10, 100), flip=True)
    out, _ = transform_boxes(np.array([[10, 0, 20, 5]], np.float32), geometry)
    np.testing.assert_allclose(out, [[70, 0, 20, 5]])


def test_clipped_dropped_and_min_visibility():
    geometry = geometry_for_window((100, 100), (0, 0, 50, 50), (50, 50))
    boxes = np.array([[40, 40, 20, 20], [60, 60, 10, 10], [0, 0, 10, 10], [45, 0, 20, 10]], np.float32)
    out, kept = transform_boxes(boxes, geometry)
    assert kept.tolist() == [0, 2, 3]  # the box wholly outside is gone
    np.testing.assert_allclose(out[0], [40, 40, 10, 10])  # clipped to the output
    out, kept = transform_boxes(boxes, geometry, min_visibility=0.3)
    assert kept.tolist() == [2]  # 25% of box 0 and box 3 stays visible: below 0.3
    out, kept = transform_boxes(boxes, geometry, min_visibility=0.25)
    assert kept.tolist() == [0, 2, 3]


def test_empty_and_degenerate_boxes():
    geometry = identity_geometry((10, 10))
    out, kept = transform_boxes(np.zeros((0, 4), np.float32), geometry)
    assert out.shape == (0, 4) and kept.shape == (0,)
    out, kept = transform_boxes(np.array([[1, 1, 0, 5], [1, 1, np.nan, 2], [2, 2, 3, 3]]), geometry)
    assert kept.tolist() == [2]


def test_clip_boxes_counts():
    boxes = np.array([[-5, 0, 10, 10], [2, 2, 3, 3], [50, 50, 5, 5]], np.float32)
    kept, indices, clipped = clip_boxes(boxes, (20, 20))
    assert indices.tolist() == [0, 1] and clipped == 2
    np.testing.assert_allclose(kept[0], [0, 0, 5, 10])


def test_resize_then_centre_crop_in_real_pixels():
    stored = (120, 200)
    box = (130, 30, 50, 60)
    image = drawn_image(*stored, box)
    resized = resized_size(*stored, 64)
    window = centre_window(*resized, (64, 64))
    geometry = geometry_for_resize_crop(stored, resized, window, flip=True)
    big = resample.resize(image, resized)
    out = big[window.top : window.top + 64, window.left : window.left + 64][:, ::-1]
    got, kept = transform_boxes(np.array([box], np.float32), geometry)
    assert kept.tolist() == [0]
    assert iou(got[0], found_box(out)) >= 0.9


@pytest.mark.parametrize("index", range(12))
def test_random_resized_crop_in_real_pixels(index):
    stored = (150, 210)
    box = (60, 40, 90, 70)
    image = drawn_image(*stored, box)
    rrc = RandomResizedCrop(48, scale=(0.3, 1.0))
    row = sample_uniforms(7, 0, [index])[0]
    window = rrc.window(*stored, row[1:])
    geometry = geometry_for_window(stored, window, rrc.out, flip=bool(row[0] < 0.5))
    out = apply(image, geometry)
    got, kept = transform_boxes(np.array([box], np.float32), geometry, min_visibility=0.0)
    if not (out[:, :, 0] > 127).any():
        assert kept.size == 0 or got[0, 2] * got[0, 3] < 4  # no drawn pixel left: at most a sliver
        return
    assert iou(got[0], found_box(out)) >= 0.9, (window, geometry.flip)


def test_window_type_is_accepted():
    geometry = geometry_for_window((10, 10), Window(0, 0, 10, 10), (5, 5))
    assert geometry.window == (0.0, 0.0, 10.0, 10.0) and geometry.as_dict()["out"] == (5, 5)
    with pytest.raises(ValueError):
        geometry_for_window((10, 10), (0, 0, 0, 10), (5, 5))


@pytest.mark.parametrize(
    "spec",
    [
        PreprocessSpec(resize=40),
        PreprocessSpec(resize=48, crop=40),
        PreprocessSpec(resize=30, resize_mode="exact"),
    ],
    ids=["resize", "resize-crop", "exact"],
)
def test_pack_geometry_matches_preprocess(spec):
    from PIL import Image

    box = (70, 20, 40, 50)
    source = Image.fromarray(drawn_image(100, 160, box))
    out, original = preprocess_image(source, b"", spec)
    geometry = pack_geometry(original, spec)
    assert geometry.out == (out.height, out.width)
    got, kept = transform_boxes(np.array([box], np.float32), geometry)
    assert kept.tolist() == [0]
    assert iou(got[0], found_box(np.asarray(out))) >= 0.9


def test_refit_fields_moves_boxes_and_filters_per_box_fields():
    from PIL import Image

    from packer.transform.box_geometry import refit_fields
    from readers.formats.packed_sample import PackedSample

    spec = PreprocessSpec(resize=40, crop=40)
    boxes = [[70, 20, 40, 50], [0, 0, 10, 10]]  # the second falls outside the centre crop
    source = Image.fromarray(drawn_image(100, 160, tuple(boxes[0])))
    out, original = preprocess_image(source, b"", spec)
    sample = PackedSample(0, "a.png", 0, b"", out.height, out.width, 3, "png", original)
    schema = {"boxes": "boxes", "categories": "box_ints", "image_id": "int"}
    fields = {"boxes": boxes, "categories": [4, 5], "image_id": 9}
    refit = refit_fields(fields, schema, sample, spec)
    assert refit["categories"] == [4] and refit["image_id"] == 9
    assert iou(refit["boxes"][0], found_box(np.asarray(out))) >= 0.9
    plain = PackedSample(0, "a.png", 0, b"", 100, 160, 3, "png", (160, 100))
    assert refit_fields(fields, schema, plain, PreprocessSpec()) is fields


def random_batch(rng: np.random.Generator, samples: int):
    """Boxes (some samples empty, some boxes degenerate, outside, NaN or partly visible) and
    geometries (windows, resizes and flips) for ``samples`` samples."""
    boxes, geometries = [], []
    for i in range(samples):
        stored = (int(rng.integers(20, 300)), int(rng.integers(20, 300)))
        n = 0 if i % 5 == 0 else int(rng.integers(1, 25))
        xy = rng.uniform(-40, max(stored) + 40, (n, 2))
        wh = rng.uniform(0, 120, (n, 2))
        wh[rng.random((n, 2)) < 0.1] = 0.0  # degenerate: no width or no height
        array = np.concatenate([xy, wh], axis=1).astype(np.float32)
        array[rng.random((n, 4)) < 0.02] = np.nan
        boxes.append(array)
        h, w = stored
        top, left = rng.uniform(0, h / 2), rng.uniform(0, w / 2)
        window = (top, left, rng.uniform(1, h - top), rng.uniform(1, w - left))
        out = (int(rng.integers(8, 260)), int(rng.integers(8, 260)))
        geometries.append(geometry_for_window(stored, window, out, bool(rng.integers(0, 2))))
    return boxes, geometries


@pytest.mark.parametrize("min_visibility", [0.0, 0.3, 0.9])
def test_batched_transform_equals_the_per_sample_one(min_visibility):
    rng = np.random.default_rng(int(min_visibility * 10))
    for samples in (1, 7, 64):
        boxes, geometries = random_batch(rng, samples)
        moved = transform_box_batch(boxes, geometries, min_visibility)
        offsets = np.cumsum([0] + [len(b) for b in boxes])
        kept_rows = np.cumsum([0, *moved.counts])
        assert moved.boxes.dtype == np.float32 and len(moved.keep) == offsets[-1]
        for i, (b, g) in enumerate(zip(boxes, geometries)):
            expected, kept = transform_boxes(b, g, min_visibility)
            # bit for bit: the same float64 arithmetic on every box
            np.testing.assert_array_equal(moved.boxes[kept_rows[i] : kept_rows[i + 1]], expected)
            np.testing.assert_array_equal(np.flatnonzero(moved.keep[offsets[i] : offsets[i + 1]]), kept)
    assert 0 < len(moved.boxes) < len(moved.keep)  # the last batch's cases drop boxes and keep boxes
    assert 0 in moved.counts  # and leave samples without boxes


def test_batched_transform_of_no_samples_and_of_empty_samples():
    empty = transform_box_batch([], [], 0.0)
    assert empty.boxes.shape == (0, 4) and len(empty.keep) == 0 and len(empty.counts) == 0
    geometry = identity_geometry((10, 10))
    none = transform_box_batch([np.zeros((0, 4), np.float32)] * 3, [geometry] * 3)
    assert none.boxes.shape == (0, 4) and none.counts.tolist() == [0, 0, 0]
