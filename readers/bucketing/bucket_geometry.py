"""The geometry of a bucketed read: each image's cover window resized to its bucket.

``BucketGeometry`` is ``readers.image.geometry.Geometry`` with the window of every sample drawn from
its bucket (``readers.bucketing.buckets.cover_window``) instead of a crop, so the batch assembler takes the
window path the RandomResizedCrop reads take (decode only the window's rows of a JPEG, resize it
into the batch slot, mirror on a flip) and boxes follow it (``geometry_for_window``). The bucket is
a function of the stored size, so a batch of one bucket (what readers/bucketing/bucket_order.py schedules)
has one output shape. ``ReadSpec.geometry`` makes one when ``buckets=`` is given
(``bucket_geometry``).

A token-budget read (readers/bucketing/token_budget.py) places a batch at its *cell* (sequence length,
grid), which the order chooses per batch, not the stored size alone: its ``TokenGeometry`` is
made once too, and gives each cell its ``BucketGeometry`` (``at_cell``, memoised), whose every
stored size lands at the cell's pixels. The assembler picks the cell of each batch
(readers/bucketing/token_batch.py); nothing is normalised or checked again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from readers.bucketing.buckets import _Buckets, cover_window
from readers.bucketing.token_budget import TokenBudget
from readers.image.geometry import Augment, Geometry, Pair, Params, Placement, sample_uniforms

DRAWS = 3  # per sample: the flip, then the window's top and left


@dataclass(frozen=True)
class BucketAugment(Augment):
    """Always draws: every bucketed sample has a window (a centre one without random_offset)."""

    @property
    def active(self) -> bool:
        return True


@dataclass(frozen=True)
class BucketGeometry(Geometry):
    """Each stored size placed at its bucket (or at ``out``, one cell's pixels), each sample's
    window its cover window there."""

    buckets: _Buckets | None = None
    out: Pair | None = None  # every stored size's output (a token cell's); None: its bucket's

    @classmethod
    def of_buckets(cls, buckets: _Buckets, flip: float = 0.0, seed: int = 0) -> BucketGeometry:
        return cls(augment=BucketAugment(None, float(flip), int(seed)), fits_all=True, buckets=buckets)

    @property
    def windowed(self) -> bool:
        return True

    def bucket(self, height: int, width: int) -> Pair:
        assert self.buckets is not None
        return self.buckets.sizes[int(self.buckets.assign(np.asarray([height]), np.asarray([width]))[0])]

    def _place(self, height: int, width: int) -> Placement:
        return Placement((height, width), 0, 0, self.out or self.bucket(height, width))

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


@dataclass(frozen=True)
class TokenGeometry(BucketGeometry):
    """A token-budget read's geometry: a ``BucketGeometry`` per cell (``at_cell``), the cell a
    batch's, chosen by the order; it places nothing itself."""

    _cells: dict[int, BucketGeometry] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def budget(self) -> TokenBudget:
        assert isinstance(self.buckets, TokenBudget)
        return self.buckets

    def at_cell(self, cell: int) -> BucketGeometry:
        """The geometry of a batch of ``cell``: every image at the cell's pixels, the same draws."""
        geometry = self._cells.get(cell)
        if geometry is None:
            out = self.budget.cell_pixels(cell)
            geometry = BucketGeometry(augment=self.augment, fits_all=True, buckets=self.buckets, out=out)
            self._cells[cell] = geometry
        return geometry

    def _place(self, height: int, width: int) -> Placement:
        raise AssertionError("a token-budget batch is placed at its cell: use at_cell(cell)")


def bucket_geometry(buckets: _Buckets, flip: float = 0.0, seed: int = 0) -> BucketGeometry:
    """The geometry of ``buckets=``: a ``TokenGeometry`` for a ``TokenBudget``."""
    kind = TokenGeometry if isinstance(buckets, TokenBudget) else BucketGeometry
    return kind.of_buckets(buckets, flip, seed)
