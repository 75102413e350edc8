"""``fields=`` on the DALI paths: each sample's fields and geometry ride through the pipeline untouched.

DALI moves pixels only; the boxes are moved in this process with the batch path's own code. Per
sample, ``BatchFeed`` (its ``external_source``) adds three outputs, which the pipeline passes
through as they are:

- ``fields``: the requested fields as canonical JSON (``readers.fields.encode``, never pickle),
  one uint8 row per sample, zero-padded to the batch's longest row (``DALIGenericIterator`` wants
  one shape per output and batch), with ``fields_length`` its true length;
- ``geometry``: int64 ``(stored height, stored width, top, left, height, width, flip)``: the
  stored size and the window and flip the pipeline applied (``BatchFeed.plan``: a
  ``RandomResizedCrop`` window in stored pixels; on the centre path the window follows from the
  stored size, as on the batch path).

``DaliFields`` turns a batch of them into the target of every batch path,
``{"label": labels, name: collated...}``: ``readers.fields.decode``, then
``readers.record_stream.batch_fields`` (``BatchAssembler.sample_geometries`` and the ``FieldPlan``
of ``open_iterable``), so boxes, ``pad_fields``, ``min_visibility`` and ``"geometry"`` are those of
the ``dataloader`` path, number for number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.fields import as_tensors, decode, encode
from readers.record import Record

OUTPUTS = ("fields", "fields_length", "geometry")
GEOMETRY_COLUMNS = 7


def _plain(value: Any) -> Any:
    """A typed field value as JSON values: arrays as (nested) lists, exact for float32 and int64."""
    return value.tolist() if isinstance(value, np.ndarray) else value


def carried(
    records: Sequence[Record], names: Sequence[str], windows: np.ndarray, flips: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three extra outputs of a batch (see the module docstring), from its records (typed
    fields, as ``read_many`` returns them) and its plan's (B, 4) windows and (B,) flips."""
    encoded = []
    for record in records:
        values = record.fields if isinstance(record.fields, dict) else {}
        encoded.append(encode({n: _plain(values[n]) for n in names if values.get(n) is not None}))
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    rows = np.zeros((len(encoded), max(1, int(lengths.max(initial=0)))), dtype=np.uint8)
    for row, data in zip(rows, encoded):
        row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    geometry = np.zeros((len(records), GEOMETRY_COLUMNS), dtype=np.int64)
    geometry[:, 0] = [r.height for r in records]
    geometry[:, 1] = [r.width for r in records]
    geometry[:, 2:6] = windows
    geometry[:, 6] = flips
    return rows, lengths, geometry


class DaliFields:
    """The target of a DALI batch with ``fields=``, from its carried outputs; see the module docstring."""

    def __init__(self, plan: Any, assembler: Any, schema: dict[str, str], where: str):
        self.plan = plan  # readers.sample_fields.FieldPlan, built as open_iterable builds it
        self.assembler = assembler  # readers.batch.BatchAssembler: its geometry only
        self.schema = schema  # the dataset's stored fields
        self.where = where

    @property
    def names(self) -> tuple[str, ...]:
        """The stored fields the feed carries: those the plan hands out (boxes among them)."""
        return tuple(n for n in self.plan.names if n in self.schema)

    def target(self, labels: Any, rows: Any, lengths: Any, geometry: Any) -> dict[str, Any]:
        from readers.record_stream import batch_fields

        data = np.ascontiguousarray(rows.cpu().numpy())
        sizes = lengths.cpu().numpy().tolist()
        geo = geometry.cpu().numpy().tolist()
        where = f"{self.where}: fields carried through DALI's pipeline"
        # Only the stored size and the fields matter here; the label is the batch's label tensor.
        records = [
            Record(b"", -1, g[0], g[1], 0, "raw", decode(self.schema, data[i, :n].tobytes(), where))
            for i, (n, g) in enumerate(zip(sizes, geo))
        ]
        params = None
        if self.plan.wants_geometry:
            random_crop = self.assembler.augment.crop is not None
            params = [(tuple(g[2:6]) if random_crop else None, bool(g[6])) for g in geo]
        return {"label": labels, **as_tensors(batch_fields(self.plan, self.assembler, records, params))}
