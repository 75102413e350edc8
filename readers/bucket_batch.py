"""The batch assembler of a bucketed read: ``readers.batch.BatchAssembler`` over a ``BucketGeometry``.

The reading paths get theirs from ``ReadSpec.geometry`` (readers/bucket_geometry.py says what a
bucketed read does); this builds one from the buckets alone, for code that assembles by hand.
"""

from __future__ import annotations

from readers.batch import BatchAssembler
from readers.bucket_geometry import DRAWS, BucketAugment, BucketGeometry
from readers.buckets import Buckets

__all__ = ["DRAWS", "BucketAssembler", "BucketAugment"]


class BucketAssembler(BatchAssembler):
    """``BatchAssembler`` over the ``BucketGeometry`` of ``buckets``."""

    def __init__(self, buckets: Buckets, layout: str = "CHW", decode_threads: int = 0, fast_dct: bool = False,
                 dct_scaling: bool = True, flip: float = 0.0, seed: int = 0):  # fmt: skip
        geometry = BucketGeometry.of_buckets(buckets, flip, seed)
        super().__init__(layout, None, None, decode_threads, fast_dct, dct_scaling, geometry=geometry)
        self.buckets = buckets
