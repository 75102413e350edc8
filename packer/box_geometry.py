"""Pack-time geometry: boxes are stored in the pixels of the STORED image, so when ``--resize`` /
``--crop`` change the image the packer moves its boxes through the same window (readers.boxes)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from packer.preprocess import PackedSample, PreprocessSpec, target_size
from readers.boxes import SampleGeometry, geometry_for_resize_crop, identity_geometry, transform_boxes
from readers.fields import encode
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


def refit_fields(
    fields: dict[str, Any], schema: Mapping[str, str], sample: PackedSample, spec: PreprocessSpec
) -> dict[str, Any]:
    """A sample's fields with its "boxes" moved into the stored image's pixels and its "box_ints"
    filtered like them; unchanged when the pack neither resizes nor crops. The packer's hook
    between ``preprocess_file`` and the writer (fields as ``readers.fields`` values)."""
    box_names = [n for n, k in schema.items() if k == "boxes" and n in fields]
    if not box_names or pack_geometry(sample.original_size, spec) == identity_geometry(
        (sample.original_size[1], sample.original_size[0])
    ):
        return fields
    boxes, kept = boxes_for_packed(np.asarray(fields[box_names[0]], np.float32).reshape(-1, 4), sample, spec)
    out = dict(fields)
    out[box_names[0]] = boxes.tolist()
    for name, kind in schema.items():
        if kind == "box_ints" and name in out:
            out[name] = [out[name][i] for i in kept.tolist()]
    return out


def refit_packed(sample: PackedSample, schema: Mapping[str, str], spec: PreprocessSpec) -> PackedSample:
    """``sample`` with its stored fields (canonical JSON) refitted by ``refit_fields``: what the
    part writer stores. Samples without boxes, and packs that keep the geometry, pass unchanged."""
    if not sample.fields or "boxes" not in schema.values() or sample.encoding == "original":
        return sample
    values = json.loads(sample.fields)
    refit = refit_fields(values, schema, sample, spec)
    if refit is not values:
        sample.fields = encode(refit).decode()
    return sample
