"""The batch assembler of a bucketed read: each image's cover window resized to its bucket.

``BucketAssembler`` is ``readers.batch.BatchAssembler`` with the window of every sample drawn
from its bucket (``readers.buckets.cover_window``) instead of a crop: the window path the
RandomResizedCrop reads take (decode only the window's rows of a JPEG, resize it into the batch
slot, mirror on a flip), and the geometry boxes follow (``geometry_for_window``). The bucket is a
function of the stored size, so a batch of one bucket (what readers/bucket_order.py schedules)
has one output shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from readers.batch import BatchAssembler, Geometry, Params
from readers.boxes import SampleGeometry, geometry_for_window
from readers.buckets import _Buckets, cover_window
from readers.geometry import Augment, sample_uniforms
from readers.record import Record

DRAWS = 3  # per sample: the flip, then the window's top and left


@dataclass(frozen=True)
class BucketAugment(Augment):
    """Always draws: every bucketed sample has a window (a centre one without random_offset)."""

    @property
    def active(self) -> bool:
        return True


class BucketAssembler(BatchAssembler):
    def __init__(self, buckets: _Buckets, layout: str = "CHW", decode_threads: int = 0,
                 fast_dct: bool = False, dct_scaling: bool = True, flip: float = 0.0,
                 seed: int = 0):  # fmt: skip
        super().__init__(layout, None, None, decode_threads, fast_dct, dct_scaling, flip, seed)
        self.buckets = buckets
        self.sizes = buckets.sizes
        self.augment = BucketAugment(None, float(flip), int(seed))

    def bucket(self, height: int, width: int) -> tuple[int, int]:
        return self.sizes[int(self.buckets.assign(np.asarray([height]), np.asarray([width]))[0])]

    def _compute_geometry(self, height: int, width: int) -> Geometry:
        return Geometry((height, width), 0, 0, self.bucket(height, width))

    def params(
        self, records: Sequence[Record], indices: Sequence[int] | np.ndarray | None, epoch: int
    ) -> list[Params]:
        if not records:
            return []
        random = self.buckets.random_offset or self.augment.flip > 0
        rows = None
        if random:
            if indices is None:
                raise ValueError("random offsets and flips need the global sample index of every record")
            rows = sample_uniforms(self.augment.seed, epoch, indices, DRAWS).tolist()
        out: list[Params] = []
        for i, r in enumerate(records):
            stored = (r.height, r.width)
            out_size = self.geometry(*stored).out
            row = rows[i] if rows is not None else None
            offset = (row[1], row[2]) if row is not None and self.buckets.random_offset else None
            flip = row is not None and row[0] < self.augment.flip
            out.append((cover_window(stored, out_size, offset), flip))
        return out

    def sample_geometries(self, records: Sequence[Record], params: Sequence[Params]) -> list[SampleGeometry]:
        out = []
        for record, (window, flip) in zip(records, params):
            stored = (record.height, record.width)
            assert window is not None  # params() gives every bucketed sample its window
            out.append(geometry_for_window(stored, tuple(window), self.geometry(*stored).out, flip))
        return out
