"""The fields a reading path hands out with each image, once for every path (``RecordStream``).

``FieldPlan`` is built from the spec's ``fields=`` and the dataset's schema. Per sample it makes the
target ``{"label": ..., name: value, ...}``; boxes follow the geometry applied to their image
(``readers.boxes.transform_boxes`` with the sample's exact ``SampleGeometry``) and every
"box_ints" field is filtered with the boxes kept; "geometry" is that geometry as plain numbers.
Per batch it collates: numbers as tensors, strings and JSON as lists, number lists and boxes as a
list of tensors, or (``pad_fields``) one padded tensor plus ``<name>_count``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.boxes import SampleGeometry, transform_boxes
from readers.errors import OptionError
from readers.fields import select

VARIABLE = ("ints", "floats", "boxes", "box_ints")


def common_schema(schemas: Sequence[dict[str, str]], wanted: Sequence[str], where: str) -> dict[str, str]:
    """The schema of ``wanted`` fields over datasets read together: each must be stored, with one
    kind, by every one of them (an OptionError names the missing ones)."""
    missing: list[str] = []
    common: dict[str, str] = {}
    for name in wanted:
        if name == "geometry":
            continue
        kinds = {s.get(name) for s in schemas}
        if None in kinds or len(kinds) != 1:
            missing.append(name)
        else:
            common[name] = kinds.pop()  # type: ignore[assignment]
    if missing:
        present = sorted(set.intersection(*(set(s) for s in schemas))) if schemas else []
        raise OptionError(
            f"{where}: fields= names {', '.join(map(repr, missing))}, not stored with one kind by every "
            f"dataset read (fields all of them store: {', '.join(present) or 'none'})"
        )
    return common


class FieldPlan:
    def __init__(
        self, schema: dict[str, str], names: Sequence[str], pad: bool = False, min_visibility: float = 0.0
    ) -> None:
        self.schema = schema
        self.names = select(schema, names, "fields=")
        self.pad = pad
        self.min_visibility = float(min_visibility)
        self.boxes = next((n for n, k in schema.items() if k == "boxes"), None)
        self.box_ints = [n for n, k in schema.items() if k == "box_ints"]

    @property
    def wants_geometry(self) -> bool:
        return self.boxes is not None and self.boxes in self.names or "geometry" in self.names

    def one(self, label: int, stored: Any, geometry: SampleGeometry | None) -> dict[str, Any]:
        """One sample's target: its label and the requested fields, boxes moved by ``geometry``."""
        values = dict(stored) if isinstance(stored, dict) else {}
        if geometry is not None and self.boxes is not None and self.boxes in values:
            boxes, kept = transform_boxes(values[self.boxes], geometry, self.min_visibility)
            values[self.boxes] = boxes
            for name in self.box_ints:
                if name in values:
                    values[name] = values[name][kept]
        if "geometry" in self.names:
            values["geometry"] = None if geometry is None else geometry.as_dict()
        out: dict[str, Any] = {"label": label}
        for name in self.names:
            out[name] = values.get(name)
        return out

    def collate(self, targets: Sequence[dict[str, Any]], labels: Any) -> dict[str, Any]:
        """A batch's fields: ``{"label": labels, name: collated...}``, numbers as NumPy arrays
        (``readers.fields.as_tensors`` makes them tensors where the batch is received: NumPy
        arrays pickle inline, where tensors from a worker would each take a shared-memory file)."""
        out: dict[str, Any] = {"label": labels}
        for name in self.names:
            values = [t[name] for t in targets]
            kind = self.schema.get(name, "json")
            if kind == "int" and all(v is not None for v in values):
                out[name] = np.asarray(values, dtype=np.int64)
            elif kind == "float" and all(v is not None for v in values):
                out[name] = np.asarray(values, dtype=np.float32)
            elif kind in VARIABLE:
                arrays = [np.asarray(v if v is not None else [], dtype=_dtype(kind)) for v in values]
                out[name] = arrays
                if self.pad:
                    out[name], out[f"{name}_count"] = _padded(arrays, kind)
            else:
                out[name] = values
        return out


def _dtype(kind: str) -> Any:
    return np.float32 if kind in ("floats", "boxes") else np.int64


def _padded(arrays: list[np.ndarray], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(padded (B, max, ...) tensor, counts (B,)): boxes padded with zeros, integers with -1."""
    tail = (4,) if kind == "boxes" else ()
    arrays = [a.reshape(-1, *tail) for a in arrays]
    longest = max((len(a) for a in arrays), default=0)
    fill = 0 if kind in ("floats", "boxes") else -1
    padded = np.full((len(arrays), longest, *tail), fill, dtype=_dtype(kind))
    for i, a in enumerate(arrays):
        padded[i, : len(a)] = a
    counts = np.asarray([len(a) for a in arrays], dtype=np.int64)
    return padded, counts
