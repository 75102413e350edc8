"""The fields a reading path hands out with each image, once for every path (``RecordStream``).

``FieldPlan`` is built from the spec's ``fields=`` and the dataset's schema. Per sample it makes the
target ``{"label": ..., name: value, ...}``; boxes follow the geometry applied to their image
(``readers.boxes.transform_boxes`` with the sample's exact ``SampleGeometry``) and every
"box_ints" field is filtered with the boxes kept; "geometry" is that geometry as plain numbers.
Per batch it collates: numbers as tensors, strings and JSON as lists, number lists and boxes as a
list of tensors, or (``pad_fields``) one padded tensor plus ``<name>_count``. ``batch`` does for a
whole batch what ``one`` then ``collate`` do sample by sample, with the same result: the batch's
boxes move as one NumPy computation (``transform_box_batch``) and stay concatenated until split or
padded, so the per-sample Python work is a dictionary lookup per field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.boxes import SampleGeometry, transform_box_batch, transform_boxes
from readers.errors import OptionError
from readers.fields import Ragged, select

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
            if kind in VARIABLE:
                arrays = [np.asarray(v if v is not None else [], dtype=_dtype(kind)) for v in values]
                out[name] = arrays
                if self.pad:
                    out[name], out[f"{name}_count"] = _padded(arrays, kind)
            else:
                out.update(self._collate_column(name, kind, values))
        return out

    @staticmethod
    def _collate_column(name: str, kind: str, values: list[Any]) -> dict[str, Any]:
        """A fixed-size field's values: int64/float32 arrays when every sample has one, else a list."""
        if kind == "int" and all(v is not None for v in values):
            return {name: np.asarray(values, dtype=np.int64)}
        if kind == "float" and all(v is not None for v in values):
            return {name: np.asarray(values, dtype=np.float32)}
        return {name: values}



    def batch(self, stored: Sequence[Any], geometries: Sequence[SampleGeometry] | None) -> dict[str, Any]:
        """A batch's collated fields (no label) from each sample's typed ``stored`` fields and, when
        ``wants_geometry``, its geometry: what ``collate`` of ``one`` per sample gives, except that
        a list of arrays comes as a ``readers.fields.Ragged`` (``as_tensors`` makes it that list)."""
        values = [s if isinstance(s, dict) else {} for s in stored]
        moved = None
        if geometries is not None and self.boxes is not None:
            boxes = [_array(v.get(self.boxes), "boxes") for v in values]
            if not self._aligned(values, boxes):  # per-box values that do not count the boxes
                targets = [self.one(0, s, g) for s, g in zip(stored, geometries)]
                collated = self.collate(targets, None)
                del collated["label"]
                return collated
            moved = transform_box_batch(boxes, geometries, self.min_visibility)
        out: dict[str, Any] = {}
        for name in self.names:
            kind = self.schema.get(name, "json")
            if name == "geometry":
                out[name] = [None if g is None else g.as_dict() for g in geometries or [None] * len(values)]
            elif kind not in VARIABLE:
                out.update(self._collate_column(name, kind, [v.get(name) for v in values]))
            else:
                if moved is not None and (name == self.boxes or kind == "box_ints"):
                    rows, counts = moved.boxes, moved.counts
                    if kind == "box_ints":
                        rows = _concat([_array(v.get(name), kind) for v in values], kind)[moved.keep]
                else:
                    arrays = [_array(v.get(name), kind) for v in values]
                    rows = _concat(arrays, kind)
                    counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
                out[name] = Ragged(rows, counts)
                if self.pad:
                    out[name], out[f"{name}_count"] = _padded_rows(rows, counts, kind)
        return out

    def _aligned(self, values: list[dict[str, Any]], boxes: list[np.ndarray]) -> bool:
        """Every sample has its boxes and as many values of each box_ints field as boxes (what
        ``readers.fields.typed`` gives): the concatenated per-box values line up with the boxes."""
        for name in self.box_ints:
            for v, b in zip(values, boxes):
                if self.boxes not in v or name not in v or len(v[name]) != len(b):
                    return False
        return True


def _array(value: Any, kind: str) -> np.ndarray:
    array = np.asarray(value if value is not None else [], dtype=_dtype(kind))
    return array.reshape(-1, 4) if kind == "boxes" else array


def _concat(arrays: list[np.ndarray], kind: str) -> np.ndarray:
    if arrays:
        return np.concatenate(arrays)
    return np.zeros((0, 4) if kind == "boxes" else (0,), dtype=_dtype(kind))


def _padded_rows(rows: np.ndarray, counts: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(padded (B, max, ...) array, counts (B,)) from rows concatenated in sample order, ``counts``
    rows per sample: boxes and floats padded with zeros, integers with -1."""
    tail = (4,) if kind == "boxes" else ()
    longest = int(counts.max()) if len(counts) else 0
    fill = 0 if kind in ("floats", "boxes") else -1
    padded = np.full((len(counts), longest, *tail), fill, dtype=_dtype(kind))
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    padded[owner, np.arange(len(rows)) - starts[owner]] = rows
    return padded, counts.copy()


def _dtype(kind: str) -> Any:
    return np.float32 if kind in ("floats", "boxes") else np.int64


def _padded(arrays: list[np.ndarray], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(padded (B, max, ...) tensor, counts (B,)): boxes padded with zeros, integers with -1."""
    arrays = [a.reshape(-1, 4) if kind == "boxes" else a.reshape(-1) for a in arrays]
    counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
    return _padded_rows(_concat(arrays, kind), counts, kind)
