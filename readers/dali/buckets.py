"""``buckets=`` on DALI's own pipeline: each batch one bucket, each sample resized to it in DALI.

The batches are ``open_iterable``'s with the same buckets: the order is the same
``readers.bucket_order.BucketOrder`` (built by ``readers.bucket_plan.bucket_order`` from the stored
sizes), so a batch holds samples of one bucket, every rank reads one bucket at each step, and a
state resumes exactly as ``open_iterable``'s does (its ``"buckets"`` key must match). The geometry
is ``readers.bucket_batch.BucketAssembler``'s: per sample, the cover window of the stored image
(``readers.buckets.cover_window``, centred or at a drawn offset) and a flip, a function of
(seed, epoch, sample index).

``BucketFeed`` hands DALI, per sample, that window (``anchor``, ``shape``: stored pixels) and its
bucket's (height, width) (``sizes``); the pipeline (readers/dali/pipeline.py) decodes only the
window (``fn.decoders.image_slice``; ``fn.slice`` for stored pixels), resizes it to ``sizes``
(``fn.resize`` with a per-sample size) and flips (``fn.crop_mirror_normalize``). The output
shape changes from batch to batch, one bucket each; DALIGenericIterator allocates each batch's
tensors by its shape. Boxes and ``"geometry"`` follow from the carried window and flip
(readers/dali/fields.py, with the bucket assembler), as they do for a RandomResizedCrop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from readers.bucket_batch import BucketAssembler
from readers.bucket_order import BucketOrder
from readers.bucket_plan import bucket_order, sample_sizes
from readers.buckets import Buckets
from readers.dali.feed import BatchFeed, Plan
from readers.dali.fields import OUTPUTS, DaliFields
from readers.errors import OptionError
from readers.record import Record
from readers.token_budget import TokenBudget

if TYPE_CHECKING:
    import os

    from readers.sample_fields import FieldPlan
    from readers.spec import ReadSpec


class BucketFeed(BatchFeed):
    """``BatchFeed`` of a bucketed read: per sample its cover window and its bucket's size."""

    def __init__(
        self,
        path: str | os.PathLike,
        order: BucketOrder,
        batch_size: int,
        buckets: Buckets,
        last_batch: str = "pad",
        *,
        flip: float = 0.0,
        reader_options: dict[str, Any] | None = None,
        fields: Mapping[str, str] | None = None,
    ):
        super().__init__(path, order, batch_size, last_batch, flip=flip, reader_options=reader_options,
                         fields=fields)  # fmt: skip
        self.buckets = buckets
        self.geometry = BucketAssembler(buckets, flip=float(flip), seed=order.seed)

    @property
    def window_first(self) -> bool:
        return True

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
        params = self.geometry.params(records, indices, epoch)
        sizes = np.array([self.geometry.geometry(r.height, r.width).out for r in records], np.float32)
        windows = np.array([w for w, _ in params], dtype=np.int64).reshape(-1, 4)
        flips = np.array([f for _, f in params], dtype=bool)
        return Plan(sizes.reshape(-1, 2), windows, flips)


def bucketed(feed: BatchFeed, spec: ReadSpec, plan: FieldPlan | None) -> tuple[BucketFeed, DaliFields | None]:
    """``feed`` (dali_loader's, unbucketed) as the bucketed read of ``spec.buckets``, and the
    ``fields=`` targets of ``plan`` moved by the bucket geometry."""
    assert spec.buckets is not None
    if isinstance(spec.buckets, TokenBudget):
        raise OptionError(
            "buckets=TokenBudget(...) runs on dali_loader's DataLoader path, not in DALI (its batches "
            "change size with L): pass device='dataloader'"
        )
    order = bucket_order(spec.buckets, sample_sizes(feed.reader), feed.order, feed.batch_size)
    assert isinstance(order, BucketOrder)  # a TokenBudget is refused above
    bucket_feed = BucketFeed(
        feed.path, order, feed.batch_size, spec.buckets, feed.last_batch, flip=feed.augment.flip,
        reader_options=feed.reader_options, fields=feed.fields,
    )  # fmt: skip
    bucket_feed._reader = feed._reader
    if plan is None:
        return bucket_feed, None
    fields = DaliFields(plan, bucket_feed.geometry, feed.reader.manifest.fields)
    fields.windowed = True
    return bucket_feed, fields
