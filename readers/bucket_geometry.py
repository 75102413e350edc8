"""The geometry of a bucketed read: each image's cover window resized to its bucket.

``BucketGeometry`` is ``readers.geometry.Geometry`` with the window of every sample drawn from
its bucket (``readers.buckets.cover_window``) instead of a crop, so the batch assembler takes the
window path the RandomResizedCrop reads take (decode only the window's rows of a JPEG, resize it
into the batch slot, mirror on a flip) and boxes follow it (``geometry_for_window``). The bucket is
a function of the stored size, so a batch of one bucket (what readers/bucket_order.py schedules)
has one output shape. ``ReadSpec.geometry`` makes one when ``buckets=`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from readers.buckets import Buckets, cover_window
from readers.geometry import Augment, Geometry, Pair, Params, Placement, sample_uniforms

DRAWS = 3  # per sample: the flip, then the window's top and left


@dataclass(frozen=True)
class BucketAugment(Augment):
    """Always draws: every bucketed sample has a window (a centre one without random_offset)."""

    @property
    def active(self) -> bool:
        return True


@dataclass(frozen=True)
class BucketGeometry(Geometry):
    """Each stored size placed at its bucket, each sample's window its cover window there."""

    buckets: Buckets | None = None

    @classmethod
    def of_buckets(cls, buckets: Buckets, flip: float = 0.0, seed: int = 0) -> BucketGeometry:
        return cls(augment=BucketAugment(None, float(flip), int(seed)), fits_all=True, buckets=buckets)

    @property
    def windowed(self) -> bool:
        return True

    def bucket(self, height: int, width: int) -> Pair:
        assert self.buckets is not None
        return self.buckets.sizes[int(self.buckets.assign(np.asarray([height]), np.asarray([width]))[0])]

    def _place(self, height: int, width: int) -> Placement:
        return Placement((height, width), 0, 0, self.bucket(height, width))

    def params(
        self, epoch: int, indices: Sequence[int] | np.ndarray | None, sizes: Sequence[Pair]
    ) -> list[Params]:
        assert self.buckets is not None
        if not len(sizes):
            return []
        random = self.buckets.random_offset or self.augment.flip > 0
        rows = None
        if random:
            if indices is None:
                raise ValueError("random offsets and flips need the global sample index of every record")
            rows = sample_uniforms(self.augment.seed, epoch, indices, DRAWS).tolist()
        out: list[Params] = []
        for i, stored in enumerate(sizes):
            row = rows[i] if rows is not None else None
            offset = (row[1], row[2]) if row is not None and self.buckets.random_offset else None
            flip = row is not None and row[0] < self.augment.flip
            out.append((cover_window(stored, self.placement(*stored).out, offset), flip))
        return out
