"""``fields=`` on the DALI paths: each sample's fields and geometry ride through the pipeline untouched.

DALI moves pixels only; the boxes are moved in this process with the batch path's own code. Per
sample, ``BatchFeed`` (its ``external_source``) adds three outputs, which the pipeline passes
through as they are:

- ``fields``: the requested fields' bytes one after the other, one uint8 row per sample,
  zero-padded to the batch's longest row (``DALIGenericIterator`` wants one shape per output and
  batch); with ``fields_length`` (int64, one column per field: its byte count, -1 when unset);
- ``geometry``: int64 ``(stored height, stored width, top, left, height, width, flip)``: the
  stored size and the window and flip the pipeline applied (``BatchFeed.plan``: a
  ``RandomResizedCrop`` window or a bucket's cover window, in stored pixels; on the centre path
  the window follows from the stored size, as on the batch path).

A field's bytes (never pickle): number lists and boxes as their little-endian int64 / float32
array (``readers.fields.field_schema.typed``'s dtypes), "int" and "float" as their exact decimal text, "str"
as UTF-8, "json" as canonical JSON. They cost a copy each way, where a JSON round trip cost tens of
microseconds per sample in this process, the one every DALI batch passes through.

``DaliFields`` turns a batch of them into the target of every batch path,
``{"label": labels, name: collated...}``: ``readers.fields.field_schema.typed``, then the read's
``Geometry.sample_geometries`` (the one the batch assembler uses) and the ``FieldPlan`` of
``open_iterable``, so boxes, ``pad_fields``, ``min_visibility`` and ``"geometry"`` are those of
the ``dataloader`` path, number for number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from readers.fields.field_schema import as_tensors, typed
from readers.image.geometry import Geometry, Window
from readers.store.record import Record

if TYPE_CHECKING:
    from readers.fields.sample_fields import FieldPlan

OUTPUTS = ("fields", "fields_length", "geometry")
GEOMETRY_COLUMNS = 7
# typed()'s dtypes, little-endian
ARRAYS = {"boxes": "<f4", "floats": "<f8", "ints": "<i8", "box_ints": "<i8"}


def to_bytes(kind: str, value: Any) -> bytes:
    """One typed field value (as ``read_many`` returns it) as bytes; see the module docstring."""
    if kind in ARRAYS:
        return np.ascontiguousarray(value, dtype=ARRAYS[kind]).tobytes()
    if kind in ("int", "float"):
        return repr(value).encode()  # exact: Python ints of any size, floats round-trip
    if kind == "str":
        return value.encode()
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def from_bytes(kind: str, data: bytes) -> Any:
    """``to_bytes``'s value back (``typed`` then gives it its reader's shape)."""
    if kind in ARRAYS:
        return np.frombuffer(data, dtype=ARRAYS[kind]).copy()  # writable: tensors are made of it
    if kind in ("int", "float"):
        return int(data) if kind == "int" else float(data)
    if kind == "str":
        return data.decode()
    return json.loads(data)


def carried(
    records: Sequence[Record], schema: Mapping[str, str], windows: np.ndarray, flips: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three extra outputs of a batch (see the module docstring): the ``schema`` fields of its
    records (typed, as ``read_many`` returns them), its plan's (B, 4) windows and (B,) flips."""
    lengths = np.full((len(records), max(1, len(schema))), -1, dtype=np.int64)
    encoded = []
    for i, record in enumerate(records):
        values = record.fields if isinstance(record.fields, dict) else {}
        blobs = []
        for k, (name, kind) in enumerate(schema.items()):
            if values.get(name) is not None:
                blobs.append(to_bytes(kind, values[name]))
                lengths[i, k] = len(blobs[-1])
        encoded.append(b"".join(blobs))
    rows = np.zeros((len(encoded), max(1, max(map(len, encoded), default=0))), dtype=np.uint8)
    for row, data in zip(rows, encoded):
        row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    geometry = np.zeros((len(records), GEOMETRY_COLUMNS), dtype=np.int64)
    geometry[:, 0] = [r.height for r in records]
    geometry[:, 1] = [r.width for r in records]
    geometry[:, 2:6] = windows
    geometry[:, 6] = flips
    return rows, lengths, geometry


def stored_fields(schema: Mapping[str, str], row: bytes, lengths: Sequence[int]) -> dict[str, Any]:
    """A sample's carried fields back from its row and per-field byte counts, as ``typed`` values."""
    values: dict[str, Any] = {}
    start = 0
    for (name, kind), length in zip(schema.items(), lengths):
        if length >= 0:
            values[name] = from_bytes(kind, row[start : start + length])
            start += length
    return typed(schema, values)


class DaliFields:
    """The target of a DALI batch with ``fields=``, from its carried outputs; see the module docstring."""

    def __init__(self, plan: FieldPlan, geometry: Geometry, stored: Mapping[str, str]):
        self.plan = plan  # built as open_iterable builds it (readers.batch.record_stream.field_plan)
        self.geometry = geometry  # the read's one geometry, the feed's
        # The stored fields the feed carries: those the plan hands out (boxes among them).
        self.schema = {n: stored[n] for n in plan.names if n in stored}

    def target(self, labels: Any, rows: Any, lengths: Any, geometry: Any) -> dict[str, Any]:
        data = rows.cpu().numpy().tobytes()
        width = rows.shape[1]
        counts = lengths.cpu().numpy().tolist()
        geo = geometry.cpu().numpy().tolist()
        rows_of = (data[i * width : (i + 1) * width] for i in range(len(counts)))
        fields = [stored_fields(self.schema, row, sizes) for row, sizes in zip(rows_of, counts)]
        geometries = None
        if self.plan.wants_geometry:
            windowed = self.geometry.windowed
            params = [(Window(*g[2:6]) if windowed else None, bool(g[6])) for g in geo]
            geometries = self.geometry.sample_geometries([(g[0], g[1]) for g in geo], params)
        return {"label": labels, **as_tensors(self.plan.batch(fields, geometries))}
