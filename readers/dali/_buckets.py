"""``buckets=`` on DALI's own pipeline: each batch one bucket, each sample resized to it in DALI.

The batches are ``open_iterable``'s with the same buckets: the order is the same
``readers.bucketing.bucket_order.BucketOrder`` (built by ``readers.bucketing.bucket_plan.bucket_order``
from the stored
sizes), so a batch holds samples of one bucket, every rank reads one bucket at each step, and a
state resumes exactly as ``open_iterable``'s does (its ``"buckets"`` key must match). The geometry
is the read's one ``readers.bucketing.bucket_geometry.BucketGeometry`` (``ReadSpec.geometry``, the batch
path's): per sample, the cover window of the stored image (``readers.bucketing.buckets.cover_window``,
centred or at a drawn offset) and a flip, a function of (seed, epoch, sample index).

``BucketFeed`` hands DALI, per sample, that window (``anchor``, ``shape``: stored pixels) and its
bucket's (height, width) (``sizes``); the pipeline (readers/dali/_pipeline.py) decodes only the
window (``fn.decoders.image_slice``; ``fn.slice`` for stored pixels), resizes it to ``sizes``
(``fn.resize`` with a per-sample size) and flips (``fn.crop_mirror_normalize``). The output
shape changes from batch to batch, one bucket each; DALIGenericIterator allocates each batch's
tensors by its shape. Boxes and ``"geometry"`` follow from the carried window and flip
(readers/dali/_fields.py, with the same geometry), as they do for a RandomResizedCrop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from readers.bucketing.bucket_geometry import BucketGeometry
from readers.bucketing.bucket_order import BucketOrder
from readers.bucketing.bucket_plan import bucket_order, sample_sizes
from readers.bucketing.token_budget import TokenBudget
from readers.dali._feed import BatchFeed, Plan
from readers.dali._fields import OUTPUTS
from readers.errors import OptionError
from readers.store.record import Record

if TYPE_CHECKING:
    import os

    from readers.spec import ReadSpec


class BucketFeed(BatchFeed):
    """``BatchFeed`` of a bucketed read: per sample its cover window and its bucket's size."""

    def __init__(
        self,
        path: str | os.PathLike,
        order: BucketOrder,
        batch_size: int,
        geometry: BucketGeometry,
        last_batch: str = "pad",
        *,
        reader_options: dict[str, Any] | None = None,
        fields: Mapping[str, str] | None = None,
    ):
        super().__init__(path, order, batch_size, last_batch, reader_options=reader_options, fields=fields,
                         geometry=geometry)  # fmt: skip
        assert geometry.buckets is not None
        self.buckets = geometry.buckets

    @property
    def identity(self) -> dict[str, str]:
        assert isinstance(self.order, BucketOrder)
        return {"buckets": self.buckets.key(self.order.group)}

    @property
    def output_names(self) -> list[str]:
        names = ["data", "labels", "sizes", "anchor", "shape"]
        if self.augment.flip > 0:
            names.append("mirror")
        if self.fields is not None:
            names += OUTPUTS
        return names

    def plan(self, records: Sequence[Record], indices: Sequence[int] | np.ndarray, epoch: int) -> Plan:
        """Each sample's window of its stored pixels, its bucket, its flip (one bucket a batch)."""
        stored = [(r.height, r.width) for r in records]
        params = self.geometry.params(epoch, indices, stored)
        sizes = np.array([self.geometry.placement(*size).out for size in stored], np.float32)
        windows = np.array([w for w, _ in params], dtype=np.int64).reshape(-1, 4)
        flips = np.array([f for _, f in params], dtype=bool)
        return Plan(sizes.reshape(-1, 2), windows, flips)


def bucketed(feed: BatchFeed, spec: ReadSpec) -> BucketFeed:
    """``feed`` (dali_loader's, over the read's ``BucketGeometry``) as the bucketed read of
    ``spec.buckets``: the ``fields=`` targets follow the same geometry, unchanged."""
    assert spec.buckets is not None
    if isinstance(spec.buckets, TokenBudget):
        raise OptionError(
            "buckets=TokenBudget(...) runs on dali_loader's DataLoader path, not in DALI (its batches "
            "change size with L): pass device='dataloader'"
        )
    order = bucket_order(spec.buckets, sample_sizes(feed.reader), feed.order, feed.batch_size)
    assert isinstance(order, BucketOrder)  # a TokenBudget is refused above
    assert isinstance(feed.geometry, BucketGeometry)  # spec.geometry of a bucketed spec
    bucket_feed = BucketFeed(
        feed.path, order, feed.batch_size, feed.geometry, feed.last_batch,
        reader_options=feed.reader_options, fields=feed.fields,
    )  # fmt: skip
    bucket_feed._reader = feed._reader
    return bucket_feed
