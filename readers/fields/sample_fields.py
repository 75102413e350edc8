"""The fields a reading path hands out with each image, once for every path (``RecordStream``).

``FieldPlan`` is built from the spec's ``fields=`` and the dataset's schema. Per sample it makes the
target ``{"label": ..., name: value, ...}``; boxes follow the geometry applied to their image
(``readers.fields.boxes.transform_boxes`` with the sample's exact ``SampleGeometry``) and every
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

from readers.errors import ImgpackError, OptionError
from readers.fields.boxes import MovedBoxes, SampleGeometry, transform_box_batch, transform_boxes
from readers.fields.field_schema import Ragged, select

VARIABLE = ("ints", "floats", "boxes", "box_ints")
DATASET = "dataset"  # with fields_per_dataset: which dataset of the mix a sample came from


def common_schema(
    schemas: Sequence[dict[str, str]], wanted: Sequence[str], where: str, datasets: Sequence[str] = ()
) -> dict[str, str]:
    """The schema of ``wanted`` fields over datasets read together: each must be stored, with one
    kind, by every one of them (an OptionError names which dataset lacks which field; ``datasets``
    names them, in the order of ``schemas``)."""
    names = list(datasets) or [f"dataset {i}" for i in range(len(schemas))]
    problems: list[str] = []
    missing: list[str] = []
    common: dict[str, str] = {}
    for name in wanted:
        if name == "geometry":
            continue
        lacking = [d for d, schema in zip(names, schemas) if name not in schema]
        kinds = {schema[name] for schema in schemas if name in schema}
        if lacking:
            problems += [f"{d} does not store {name!r}" for d in lacking]
        elif len(kinds) != 1:
            problems.append(
                f"{name!r} is " + " but ".join(f"{schema[name]} in {d}" for d, schema in zip(names, schemas))
            )
        else:
            common[name] = kinds.pop()
            continue
        missing.append(name)
    if missing:
        present = sorted(set.intersection(*(set(s) for s in schemas))) if schemas else []
        hint = "; fields_per_dataset= reads each dataset's own fields" if len(schemas) > 1 else ""
        raise OptionError(
            f"{where}: fields= names {', '.join(map(repr, missing))}, not stored with one kind by every "
            f"dataset read ({'; '.join(problems)}); fields all of them store: {', '.join(present) or 'none'}"
            f"{hint}"
        )
    return common


def per_dataset_schema(
    schemas: Sequence[dict[str, str]], wanted: Sequence[Sequence[str]], where: str, datasets: Sequence[str]
) -> dict[str, str]:
    """The schema of the fields that ``wanted[i]`` names for dataset ``i`` (``fields_per_dataset``):
    each stored by its dataset, one kind per name across datasets, one name for boxes."""
    if len(wanted) != len(schemas):
        raise OptionError(
            f"{where}: fields_per_dataset= has {len(wanted)} lists for {len(schemas)} datasets; give one "
            "list of field names per dataset, in the order of the paths"
        )
    union: dict[str, str] = {}
    owners: dict[str, str] = {}
    for dataset, schema, names in zip(datasets, schemas, wanted):
        if DATASET in names:
            raise OptionError(
                f"{where}: with fields_per_dataset= the target's {DATASET!r} says which dataset a sample "
                f"came from; {dataset}'s field {DATASET!r} cannot be read alongside it"
            )
        try:
            select(schema, names, f"fields_per_dataset= for {dataset}")
        except ImgpackError as exc:
            raise OptionError(str(exc)) from exc
        for name in names:
            if name == "geometry":
                continue
            kind = schema[name]
            if union.setdefault(name, kind) != kind:
                raise OptionError(
                    f"{where}: field {name!r} is {union[name]} in {owners[name]} but {kind} in {dataset}; "
                    "a batch collates one kind per name (leave it out of one dataset's list)"
                )
            owners.setdefault(name, dataset)
    boxes = sorted({n for n, k in union.items() if k == "boxes"})
    if len(boxes) > 1:
        raise OptionError(
            f"{where}: fields_per_dataset= reads boxes under several names ({', '.join(boxes)}); the crops "
            "move one boxes field: read one of them, or re-pack with one name"
        )
    return union


class FieldPlan:
    """What ``fields=`` (or a mix's ``fields_per_dataset=``) asks of each sample and batch.

    With ``per_dataset`` (one list of names per dataset of a mix) sample ``k`` carries the fields
    its own dataset's list names plus ``"dataset"`` (its index in the mix); a batch holds the
    union of the lists, each collated over the whole batch, with what a sample's dataset does not
    carry as None (numbers, text, JSON; a number field with a None becomes a list) or empty (number
    lists and boxes), and ``"dataset"`` as an int64 tensor."""

    def __init__(
        self,
        schema: dict[str, str],
        names: Sequence[str],
        pad: bool = False,
        min_visibility: float = 0.0,
        per_dataset: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.schema = schema
        if per_dataset is not None:
            names = list(dict.fromkeys(n for wanted in per_dataset for n in wanted))
        self.names = select(schema, names, "fields=")
        self.per_dataset = None if per_dataset is None else [frozenset(w) for w in per_dataset]
        self.pad = pad
        self.min_visibility = float(min_visibility)
        self.boxes = next((n for n, k in schema.items() if k == "boxes"), None)
        self.box_ints = [n for n, k in schema.items() if k == "box_ints"]

    @property
    def wants_geometry(self) -> bool:
        return self.boxes is not None and self.boxes in self.names or "geometry" in self.names

    def _values(self, stored: Any, source: int | None) -> dict[str, Any]:
        """The sample's stored fields this plan may hand out (those its dataset's list names)."""
        if not isinstance(stored, dict):
            return {}
        if self.per_dataset is None:
            return stored
        allowed = self.per_dataset[int(source)]  # type: ignore[arg-type]
        return {k: v for k, v in stored.items() if k in allowed}

    def _names_of(self, source: int | None) -> Sequence[str]:
        if self.per_dataset is None:
            return self.names
        allowed = self.per_dataset[int(source)]  # type: ignore[arg-type]
        return [n for n in self.names if n in allowed]

    def one(
        self, label: int, stored: Any, geometry: SampleGeometry | None, source: int | None = None
    ) -> dict[str, Any]:
        """One sample's target: its label and the requested fields, boxes moved by ``geometry``
        (with ``per_dataset``: the fields of dataset ``source`` and ``"dataset": source``)."""
        values = dict(self._values(stored, source))
        if geometry is not None and self.boxes is not None and self.boxes in values:
            boxes, kept = transform_boxes(values[self.boxes], geometry, self.min_visibility)
            values[self.boxes] = boxes
            for name in self.box_ints:
                if name in values:
                    values[name] = values[name][kept]
        names = self._names_of(source)
        if "geometry" in names:
            values["geometry"] = None if geometry is None else geometry.as_dict()
        out: dict[str, Any] = {"label": label}
        for name in names:
            out[name] = values.get(name)
        if self.per_dataset is not None:
            out[DATASET] = int(source)  # type: ignore[arg-type]
        return out

    def collate(self, targets: Sequence[dict[str, Any]], labels: Any) -> dict[str, Any]:
        """A batch's fields: ``{"label": labels, name: collated...}``, numbers as NumPy arrays
        (``readers.fields.field_schema.as_tensors`` makes them tensors where the batch is received: NumPy
        arrays pickle inline, where tensors from a worker would each take a shared-memory file)."""
        out: dict[str, Any] = {"label": labels}
        for name in self.names:
            values = [t.get(name) for t in targets]
            kind = self.schema.get(name, "json")
            if kind in VARIABLE:
                arrays = [_array(v, kind) for v in values]  # a sample without boxes: (0, 4)
                out[name] = arrays
                if self.pad:
                    out[name], out[f"{name}_count"] = _padded(arrays, kind)
            else:
                out.update(self._collate_column(name, kind, values))
        if self.per_dataset is not None:
            out[DATASET] = np.asarray([t[DATASET] for t in targets], dtype=np.int64)
        return out

    @staticmethod
    def _collate_column(name: str, kind: str, values: list[Any]) -> dict[str, Any]:
        """A fixed-size field's values: int64/float64 arrays when every sample has one, else a list."""
        if kind == "int" and all(v is not None for v in values):
            return {name: np.asarray(values, dtype=np.int64)}
        if kind == "float" and all(v is not None for v in values):
            return {name: np.asarray(values, dtype=np.float64)}
        return {name: values}

    def batch(
        self,
        stored: Sequence[Any],
        geometries: Sequence[SampleGeometry] | None,
        sources: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """A batch's collated fields (no label) from each sample's typed ``stored`` fields, when
        ``wants_geometry`` its geometry, and with ``per_dataset`` its dataset (``sources``): what
        ``collate`` of ``one`` per sample gives, except that a list of arrays comes as a
        ``readers.fields.field_schema.Ragged`` (``as_tensors`` makes it that list)."""
        own: list[Any] = [None] * len(stored) if sources is None else sources.tolist()
        values = [self._values(s, k) for s, k in zip(stored, own)]
        moved = given = None
        if geometries is not None and self.boxes is not None:
            boxes = [_array(v.get(self.boxes), "boxes") for v in values]
            given = np.fromiter((len(b) for b in boxes), np.int64, len(boxes))
            if not self._aligned(values, given):  # per-box values that do not count the boxes
                targets = [self.one(0, s, g, k) for s, g, k in zip(stored, geometries, own)]
                collated = self.collate(targets, None)
                del collated["label"]
                return collated
            moved = transform_box_batch(boxes, geometries, self.min_visibility)
        out: dict[str, Any] = {}
        for name in self.names:
            kind = self.schema.get(name, "json")
            if name == "geometry":
                each: list[SampleGeometry | None] = [None] * len(values)
                if geometries is not None:
                    each = list(geometries)
                asked = [name in self._names_of(k) for k in own]
                out[name] = [g.as_dict() if g is not None and a else None for g, a in zip(each, asked)]
            elif kind not in VARIABLE:
                out.update(self._collate_column(name, kind, [v.get(name) for v in values]))
            else:
                if moved is not None and given is not None and (name == self.boxes or kind == "box_ints"):
                    rows, counts = moved.boxes, moved.counts
                    if kind == "box_ints":
                        rows, counts = _kept_box_values(values, name, moved, given)
                else:
                    arrays = [_array(v.get(name), kind) for v in values]
                    rows = _concat(arrays, kind)
                    counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
                out[name] = Ragged(rows, counts)
                if self.pad:
                    out[name], out[f"{name}_count"] = _padded_rows(rows, counts, kind)
        if self.per_dataset is not None:
            out[DATASET] = np.asarray(own, dtype=np.int64)
        return out

    def _aligned(self, values: list[dict[str, Any]], given: np.ndarray) -> bool:
        """Every sample with a box_ints field has its boxes and as many values as boxes (what
        ``readers.fields.field_schema.typed`` gives): the concatenated per-box values line up with the
        boxes."""
        for name in self.box_ints:
            for v, n in zip(values, given.tolist()):
                if name in v and (self.boxes not in v or len(v[name]) != n):
                    return False
        return True


def _kept_box_values(
    values: list[dict[str, Any]], name: str, moved: MovedBoxes, given: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, counts) of box_ints field ``name`` for the boxes ``moved`` kept; a sample without
    the field has none (as ``one`` leaves it None)."""
    present = np.fromiter((name in v for v in values), bool, len(values))
    arrays = [_array(v[name], "box_ints") for v in values if name in v]
    owner = np.repeat(np.arange(len(values)), given)
    rows = _concat(arrays, "box_ints")[moved.keep[present[owner]]]
    return rows, np.where(present, moved.counts, 0)


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
    return np.float32 if kind == "boxes" else np.float64 if kind == "floats" else np.int64


def _padded(arrays: list[np.ndarray], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(padded (B, max, ...) tensor, counts (B,)): boxes padded with zeros, integers with -1."""
    arrays = [a.reshape(-1, 4) if kind == "boxes" else a.reshape(-1) for a in arrays]
    counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
    return _padded_rows(_concat(arrays, kind), counts, kind)
