"""Pack-time geometry: boxes are stored in the pixels of the STORED image, so when ``--resize`` /
``--crop`` change the image the packer moves its boxes through the same window (readers.boxes)."""

from __future__ import annotations

import numpy as np

from packer.preprocess import PackedSample, PreprocessSpec, target_size
from readers.boxes import SampleGeometry, geometry_for_resize_crop, identity_geometry, transform_boxes
from readers.geometry import centre_window


def pack_geometry(original_size: tuple[int, int], spec: PreprocessSpec) -> SampleGeometry:
    """What ``preprocess_image`` does to an upright source of ``original_size`` (width, height,
    as ``PackedSample.original_size``): resize to ``target_size``, then the centre ``--crop``."""
    width, height = original_size
    if spec.encode == "original":
        return identity_geometry((height, width))
    out_w, out_h = target_size(width, height, spec)
    window = centre_window(out_h, out_w, (spec.crop, spec.crop)) if spec.crop else None
    return geometry_for_resize_crop((height, width), (out_h, out_w), window)


def boxes_for_packed(
    boxes: np.ndarray, sample: PackedSample, spec: PreprocessSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Source boxes (xywh, upright source pixels) in the pixels of ``sample``'s stored image, and
    the indices of the boxes kept (a ``--crop`` can cut some away)."""
    geometry = pack_geometry(sample.original_size, spec)
    if geometry.out != (sample.height, sample.width):
        stored = f"{sample.height}x{sample.width}"
        raise RuntimeError(f"{sample.rel}: pack geometry {geometry.out} != stored {stored}")
    return transform_boxes(boxes, geometry)
