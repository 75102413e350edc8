"""Per-sample fields as ``tf.train.Example`` features, named as the TF Object Detection API does.

A "boxes" field (COCO x, y, w, h in pixels) becomes ``image/object/bbox/xmin|ymin|xmax|ymax``
normalised to [0, 1] by the stored image's size, and the box_ints field named "categories" (or
the only one) ``image/object/class/label`` (the class index + 1: the TF Object Detection API's
label maps number classes from 1 and keep 0 for the background) beside
``image/object/class/text`` (the class names), so TensorFlow's and DALI's readers parse them; every
other field is a feature of its own name (text as bytes, JSON as its text, numbers as numbers).
The exact values also go as canonical JSON in ``imgpack/fields``, written right after the image,
which the reader takes back (normalised float32 corners would not give the pixels back exactly).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

FIELDS_FEATURE = b"imgpack/fields"
TF_LABEL_OFFSET = 1  # image/object/class/label = class index + 1, as the TF Object Detection API counts


def _class_name(classes: Sequence[str], index: int) -> str:
    return classes[index] if 0 <= index < len(classes) else str(index)


class Floats(list):
    """A float_list feature even when empty (an empty plain list would be a bytes_list)."""


class Ints(list):
    """An int64_list feature even when empty."""


def category_field(schema: dict[str, str]) -> str | None:
    ints = [name for name, kind in schema.items() if kind == "box_ints"]
    if "categories" in ints:
        return "categories"
    return ints[0] if len(ints) == 1 else None


def field_features(
    schema: dict[str, str], text: str, height: int, width: int, classes: Sequence[str] = ()
) -> dict[str, Any]:
    """The features of one sample's fields (``text``: their canonical JSON; ``classes``: the
    dataset's class names, for ``image/object/class/text``)."""
    values = json.loads(text) if text else {}
    out: dict[str, Any] = {FIELDS_FEATURE.decode(): text.encode()}
    category = category_field(schema)
    for name, kind in schema.items():
        value = values.get(name)
        if kind == "boxes":
            boxes = value or []
            out["image/object/bbox/xmin"] = Floats(b[0] / width for b in boxes)
            out["image/object/bbox/ymin"] = Floats(b[1] / height for b in boxes)
            out["image/object/bbox/xmax"] = Floats((b[0] + b[2]) / width for b in boxes)
            out["image/object/bbox/ymax"] = Floats((b[1] + b[3]) / height for b in boxes)
        elif value is None:
            continue
        elif kind == "box_ints" and name == category:
            # the TF Object Detection API's label maps number classes from 1 (0: background)
            out["image/object/class/label"] = Ints(v + TF_LABEL_OFFSET for v in value)
            if classes:
                out["image/object/class/text"] = [_class_name(classes, v).encode() for v in value]
        elif kind in ("int", "ints", "box_ints"):
            out[name] = Ints(value if isinstance(value, list) else [value])
        elif kind in ("float", "floats"):
            out[name] = Floats(value if isinstance(value, list) else [value])
        elif kind == "str":
            out[name] = value.encode("utf-8")
        else:
            out[name] = json.dumps(value, ensure_ascii=False, sort_keys=True).encode()
    return out
