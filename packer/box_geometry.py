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
from readers.masks import SEGMENTATION, refit_segmentations


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
    """A sample's fields with its "boxes" moved into the stored image's pixels and its "box_ints"
    filtered like them (a ``--crop`` can cut boxes away); ``fields`` itself when the pack kept the
    source's geometry. The part writer's hook (fields as ``readers.fields`` values)."""
    name = next((n for n, k in schema.items() if k == "boxes" and n in fields), None)
    geometry = pack_geometry(sample.original_size, spec)
    if name is None or geometry == identity_geometry(geometry.stored):
        return fields
    if geometry.out != (sample.height, sample.width):
        stored = f"{sample.height}x{sample.width}"
        raise RuntimeError(f"{sample.rel}: pack geometry {geometry.out} != stored {stored}")
    boxes, kept = transform_boxes(np.asarray(fields[name], np.float32).reshape(-1, 4), geometry)
    out = {**fields, name: boxes.tolist()}
    for other, kind in schema.items():
        if kind == "box_ints" and other in out:
            out[other] = [out[other][i] for i in kept.tolist()]
    if isinstance(out.get(SEGMENTATION), list):  # per box, like the box_ints, and moved with the pixels
        out[SEGMENTATION] = refit_segmentations([out[SEGMENTATION][i] for i in kept.tolist()], geometry)
    return out


def refit_packed(sample: PackedSample, schema: Mapping[str, str], spec: PreprocessSpec) -> PackedSample:
    """``sample`` with its stored fields (canonical JSON) refitted by ``refit_fields``: what the
    part writer stores. Samples without boxes, and packs that keep the geometry, pass unchanged."""
    width, height = sample.original_size
    kept_geometry = not spec.crop and (sample.height, sample.width) == (height, width)
    if not sample.fields or kept_geometry or sample.encoding == "original" or "boxes" not in schema.values():
        return sample
    values = json.loads(sample.fields)
    refit = refit_fields(values, schema, sample, spec)
    if refit is not values:
        sample.fields = encode(refit).decode()
    return sample
