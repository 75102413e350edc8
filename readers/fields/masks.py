"""COCO segmentations as instance masks that follow the image: the same ``SampleGeometry`` as the boxes.

``pack coco`` keeps each annotation's ``segmentation`` (polygons, or run-length encoding for crowds)
as the JSON field ``segmentation``, one entry per box (None where the annotation has none), in the
pixels of the stored image: a pack-time ``--resize``/``--crop`` refits them with the boxes
(``refit_segmentations``). At read time ``masks_for`` turns a sample's entries into ``(N, H, W)``
uint8 masks of the output image: polygon vertices are moved through the window, scale and flip and
rasterised at the output size; an RLE is decoded at its stored size and resampled (nearest) through
the same window, so a mask covers the pixels its box frames. pycocotools is the decoder (optional:
``pip install pycocotools``, in ``imgpack[all]``); its absence is an ``ImgpackError`` naming that.

Coordinates are continuous, as for boxes (``readers.fields.boxes``): pixel ``i`` covers ``[i, i + 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.errors import ImgpackError
from readers.fields.boxes import SampleGeometry

SEGMENTATION = "segmentation"  # the field pack coco writes, one entry per box


def _mask_api() -> Any:
    try:
        from pycocotools import mask
    except ImportError:
        raise ImgpackError(
            "masks are decoded with pycocotools, which is not installed: pip install pycocotools "
            "(or imgpack[all])"
        ) from None
    return mask


def _is_rle(value: Any) -> bool:
    return isinstance(value, dict) and "counts" in value and "size" in value


def _affine(geometry: SampleGeometry) -> tuple[float, float, float, float]:
    """(sx, sy, left, top): stored x -> (x - left) * sx, y -> (y - top) * sy."""
    top, left, height, width = geometry.window
    return geometry.out[1] / width, geometry.out[0] / height, left, top


def move_polygon(points: Sequence[float], geometry: SampleGeometry) -> list[float]:
    """A COCO polygon ``[x0, y0, x1, y1, ...]`` in stored pixels moved into output pixels."""
    sx, sy, left, top = _affine(geometry)
    xy = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    x = (xy[:, 0] - left) * sx
    if geometry.flip:
        x = geometry.out[1] - x
    return np.stack([x, (xy[:, 1] - top) * sy], axis=1).reshape(-1).tolist()


def _rle_of(value: dict[str, Any]) -> dict[str, Any]:
    """A COCO RLE (counts as a list, or compressed text) as pycocotools' compressed RLE."""
    api = _mask_api()
    height, width = (int(v) for v in value["size"])
    if isinstance(value["counts"], list):
        return api.frPyObjects(value, height, width)
    counts = value["counts"]
    return {"size": [height, width], "counts": counts.encode() if isinstance(counts, str) else counts}


def _warp(mask: np.ndarray, geometry: SampleGeometry) -> np.ndarray:
    """A stored-pixel mask resampled (nearest) through the geometry's window and flip."""
    import cv2

    sx, sy, left, top = _affine(geometry)
    # pixel centres: out x + 0.5 = (in x + 0.5 - left) * sx
    matrix = np.array([[sx, 0, (0.5 - left) * sx - 0.5], [0, sy, (0.5 - top) * sy - 0.5]], np.float64)
    out_h, out_w = geometry.out
    moved = cv2.warpAffine(mask, matrix, (out_w, out_h), flags=cv2.INTER_NEAREST, borderValue=0)
    return np.ascontiguousarray(moved[:, ::-1]) if geometry.flip else moved


def _one_mask(value: Any, geometry: SampleGeometry, where: str) -> np.ndarray:
    api = _mask_api()
    out_h, out_w = geometry.out
    if value is None or value == []:
        return np.zeros((out_h, out_w), np.uint8)
    if isinstance(value, list) and all(isinstance(p, list) for p in value):
        polygons = [move_polygon(p, geometry) for p in value if len(p) >= 6]
        if not polygons:
            return np.zeros((out_h, out_w), np.uint8)
        rle = api.merge(api.frPyObjects(polygons, out_h, out_w))
        return np.asarray(api.decode(rle), dtype=np.uint8)
    if _is_rle(value):
        stored = np.asarray(api.decode(_rle_of(value)), dtype=np.uint8)
        if stored.shape != tuple(geometry.stored):
            raise ImgpackError(
                f"{where}: an RLE mask of {stored.shape[0]}x{stored.shape[1]} for an image stored at "
                f"{geometry.stored[0]}x{geometry.stored[1]}; re-pack it with pack coco"
            )
        return _warp(stored, geometry)
    raise ImgpackError(f"{where}: a segmentation is neither polygons nor an RLE; re-pack it with pack coco")


def masks_for(segmentations: Sequence[Any], geometry: SampleGeometry, where: str = "masks") -> np.ndarray:
    """(N, H, W) uint8 masks of the output image, one per entry of ``segmentations`` (COCO polygons
    or RLE in stored pixels; None gives an empty mask), through ``geometry``."""
    out_h, out_w = geometry.out
    if not len(segmentations):
        return np.zeros((0, out_h, out_w), np.uint8)
    return np.stack([_one_mask(value, geometry, where) for value in segmentations])


def refit_segmentations(segmentations: Sequence[Any], geometry: SampleGeometry) -> list[Any]:
    """Segmentations in source pixels moved into the stored image of ``geometry`` (the pack-time
    ``--resize``/``--crop``; no flip): polygons exactly, an RLE resampled and encoded again."""
    out: list[Any] = []
    for value in segmentations:
        if isinstance(value, list) and all(isinstance(p, list) for p in value):
            out.append([[round(v, 3) for v in move_polygon(p, geometry)] for p in value])
        elif _is_rle(value):
            api = _mask_api()
            mask = _warp(np.asarray(api.decode(_rle_of(value)), dtype=np.uint8), geometry)
            rle = api.encode(np.asfortranarray(mask))
            out.append({"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode()})
        else:
            out.append(value)
    return out


def orient_segmentations(
    segmentations: Sequence[Any], moves: tuple[bool, bool, bool], upright: tuple[int, int]
) -> list[Any]:
    """Segmentations in the raw pixel grid of an EXIF-rotated source, turned as its pixels are:
    ``moves`` (x and y swapped, then x mirrored, then y mirrored), ``upright`` its (width, height)."""
    swap, mirror_x, mirror_y = moves
    width, height = upright
    out: list[Any] = []
    for value in segmentations:
        if isinstance(value, list) and all(isinstance(p, list) for p in value):
            turned = []
            for polygon in value:
                xy = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
                x, y = (xy[:, 1], xy[:, 0]) if swap else (xy[:, 0], xy[:, 1])
                x = width - x if mirror_x else x
                y = height - y if mirror_y else y
                turned.append(np.stack([x, y], axis=1).reshape(-1).tolist())
            out.append(turned)
        elif _is_rle(value):
            api = _mask_api()
            mask = np.asarray(api.decode(_rle_of(value)), dtype=np.uint8)
            mask = mask.T if swap else mask
            mask = mask[:, ::-1] if mirror_x else mask
            mask = mask[::-1] if mirror_y else mask
            rle = api.encode(np.asfortranarray(mask))
            out.append({"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode()})
        else:
            out.append(value)
    return out
