"""Boxes follow the image: one transform from stored pixels to the pixels of a returned image.

A sample's geometry is the window of the stored image that became the output, the output size and
whether it was mirrored (``SampleGeometry``). Every path (pack-time ``--resize``/``--crop``, the
centre path, ``RandomResizedCrop``, flips) describes what it did as one, and ``transform_boxes``
maps COCO ``xywh`` boxes through it, so a box frames the same pixels before and after.

Coordinates are continuous: pixel ``i`` covers ``[i, i + 1)``, so a box edge at ``x`` in a window
that starts at ``left`` and is scaled by ``s`` lands at ``(x - left) * s``; that is where the
resampler (``readers.image.resample``, half-pixel centres) puts the pixels too. A leaf: numpy only.

The degenerate-box rule, the same on every path (pack-time clipping included): a box whose
clipped width or height is below ``MIN_SIDE`` output pixels is dropped. A box that only touches
the crop window would otherwise come back with a side of 1e-14 px, which collapses to zero in
float32 x1/x2 and trips detection models' "boxes must have positive width and height" check.
``min_visibility`` drops a box keeping *less* than that fraction of its area: one keeping exactly
that fraction is kept, to ``VISIBILITY_TOLERANCE``: boxes are stored in float32, so a box cut at
its middle in decimal coordinates keeps 0.4999995 of its area in binary ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Pair = tuple[int, int]
MIN_SIDE = 0.01  # output pixels: a clipped box narrower or lower than this is dropped
VISIBILITY_TOLERANCE = 1e-4  # of the visible fraction: float32 rounding of the box coordinates


@dataclass(frozen=True)
class SampleGeometry:
    """What was done to one stored image: ``window`` of it (stored pixels) became ``out``."""

    stored: tuple[int, int]  # (h, w) of the stored image the boxes are in
    # (top, left, height, width) in stored pixels that became the output
    window: tuple[float, float, float, float]
    out: tuple[int, int]  # (h, w) of the returned image
    flip: bool  # mirrored left-right after crop and resize

    def as_dict(self) -> GeometryRecord:
        """Plain numbers, for users who transform their own targets (keypoints, their own masks)."""
        return GeometryRecord(stored=self.stored, window=self.window, out=self.out, flip=self.flip)


class GeometryRecord(dict):
    """``fields=["geometry"]``: what was done to a sample's image, on every path the same type.

    Keys in this order: ``stored`` (h, w) ints, the stored image's size; ``window`` (top, left,
    height, width) floats, the rectangle of the stored image, in its pixels (pixel ``i`` covers
    ``[i, i + 1)``), that was resized to become the output; ``out`` (h, w) ints, the returned
    image's size; ``flip`` bool, mirrored left-right after the resize. A stored point ``(x, y)``
    lands at ``((x - left) * out_w / width, (y - top) * out_h / height)``, then ``x -> out_w - x``
    with ``flip``. A dict (JSON-ready), whose type a DataLoader's default collate keeps: a batch
    holds a list of records (``readers.fields.targets`` registers that), not columns of tensors."""

    __slots__ = ()


def identity_geometry(stored: Pair) -> SampleGeometry:
    """The image returned as stored."""
    h, w = int(stored[0]), int(stored[1])
    return SampleGeometry((h, w), (0.0, 0.0, float(h), float(w)), (h, w), False)


def geometry_for_window(
    stored: Pair, window: Sequence[float], out: Pair, flip: bool = False
) -> SampleGeometry:
    """``window`` (top, left, height, width) of the stored image resized to ``out`` (h, w), then
    mirrored with ``flip``: a ``RandomResizedCrop`` window, or any crop taken in stored pixels."""
    top, left, height, width = (float(v) for v in window)
    if height <= 0 or width <= 0:
        raise ValueError(f"window {tuple(window)} has no area")
    size = (int(stored[0]), int(stored[1]))
    return SampleGeometry(size, (top, left, height, width), _pair(out), bool(flip))


def geometry_for_resize_crop(
    stored: Pair,
    resized: Pair,
    crop_window_in_resized: Sequence[float] | None,
    out: Pair | None = None,
    flip: bool = False,
) -> SampleGeometry:
    """The stored image resized to ``resized`` (h, w), then ``crop_window_in_resized`` (top, left,
    height, width in resized pixels; None: the whole resized image) cut out and, if ``out`` differs
    from the window, resized again to ``out``; mirrored with ``flip``. The centre path of every
    reader, and the packer's ``--resize``/``--crop``."""
    sh, sw = float(stored[0]), float(stored[1])
    rh, rw = float(resized[0]), float(resized[1])
    if crop_window_in_resized is None:
        crop_window_in_resized = (0.0, 0.0, rh, rw)
    top, left, height, width = (float(v) for v in crop_window_in_resized)
    if out is None:
        out = (round(height), round(width))
    sy, sx = sh / rh, sw / rw
    return geometry_for_window(stored, (top * sy, left * sx, height * sy, width * sx), out, flip)


def transform_boxes(
    boxes: np.ndarray, geometry: SampleGeometry, min_visibility: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(N, 4) float32 COCO xywh in stored pixels -> (M, 4) float32 xywh in output pixels, clipped to
    the output; a box left with a side under ``MIN_SIDE`` px is dropped, and one whose visible
    fraction of its area is below min_visibility; also returns the int64 indices of the kept
    boxes (to filter per-box fields)."""
    moved = transform_box_batch([boxes], [geometry], min_visibility)
    return moved.boxes, np.flatnonzero(moved.keep).astype(np.int64)


@dataclass(frozen=True)
class MovedBoxes:
    """A batch's boxes after ``transform_box_batch``, concatenated in sample order."""

    boxes: np.ndarray  # (M, 4) float32, the kept boxes of every sample, in output pixels
    keep: np.ndarray  # (N,) bool over the concatenated input boxes: which were kept
    counts: np.ndarray  # (B,) int64, kept boxes per sample


def transform_box_batch(
    boxes: Sequence[np.ndarray], geometries: Sequence[SampleGeometry], min_visibility: float = 0.0
) -> MovedBoxes:
    """``transform_boxes`` for a whole batch at once: sample ``i``'s boxes (N_i, 4) moved through
    ``geometries[i]``, as one NumPy computation over all boxes (each carries its sample's window,
    output size and flip), so the per-sample Python work is a length and a tuple."""
    arrays = [np.asarray(b, dtype=np.float64).reshape(-1, 4) for b in boxes]
    counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
    flat = np.concatenate(arrays) if arrays else np.zeros((0, 4))
    owner = np.repeat(np.arange(len(arrays)), counts)
    windows = np.array([g.window for g in geometries], dtype=np.float64).reshape(-1, 4)[owner]
    outs = np.array([g.out for g in geometries], dtype=np.float64).reshape(-1, 2)[owner]
    flips = np.fromiter((g.flip for g in geometries), bool, len(geometries))[owner]
    top, left, height, width = windows.T
    out_h, out_w = outs.T
    sy, sx = out_h / height, out_w / width
    x0 = (flat[:, 0] - left) * sx
    y0 = (flat[:, 1] - top) * sy
    x1 = x0 + flat[:, 2] * sx
    y1 = y0 + flat[:, 3] * sy
    area = (x1 - x0) * (y1 - y0)
    cx0, cx1 = np.clip(x0, 0, out_w), np.clip(x1, 0, out_w)
    cy0, cy1 = np.clip(y0, 0, out_h), np.clip(y1, 0, out_h)
    visible = (cx1 - cx0) * (cy1 - cy0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(area > 0, visible / np.where(area > 0, area, 1), 0.0)
    wide = (cx1 - cx0 >= MIN_SIDE) & (cy1 - cy0 >= MIN_SIDE)
    keep = wide & np.isfinite(area) & (fraction >= min_visibility - VISIBILITY_TOLERANCE)
    cx0, cx1 = np.where(flips, out_w - cx1, cx0), np.where(flips, out_w - cx0, cx1)
    result = np.stack([cx0, cy0, cx1 - cx0, cy1 - cy0], axis=1)[keep].astype(np.float32)
    return MovedBoxes(result, keep, np.bincount(owner[keep], minlength=len(arrays)).astype(np.int64))


def clip_boxes(boxes: np.ndarray, size: Pair) -> tuple[np.ndarray, np.ndarray, int]:
    """Source boxes clipped to an image of ``size`` (h, w): (kept boxes, kept indices, how many were
    clipped). A box left without area is dropped (counted as clipped); the packer records the count."""
    kept, indices = transform_boxes(boxes, identity_geometry(size))
    original = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)[indices]
    changed = int(np.count_nonzero(np.any(np.abs(kept - original) > 1e-3, axis=1)))
    return kept, indices, changed + (len(np.asarray(boxes).reshape(-1, 4)) - len(indices))


def _pair(value: Pair) -> tuple[int, int]:
    h, w = int(value[0]), int(value[1])
    if h < 1 or w < 1:
        raise ValueError(f"output size {value!r} must be positive")
    return h, w
