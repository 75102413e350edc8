"""The collate ``make_loader`` gives the per-sample path when samples carry ``fields=``.

torch's ``default_collate`` cannot batch a sample's variable-length fields (boxes, number lists:
one shape per sample), so ``make_loader(open_iterable(ds, fields=["boxes"]), batch_size=4)``
stopped with a collate traceback. ``FieldCollate`` batches the images as ``default_collate`` does
and the targets with the stream's own ``FieldPlan.collate``, so a per-sample batch has the shape
of a whole batch from ``open_iterable(batch_size=...)``: ``{"label": int64 tensor, name: ...}``
with numbers as tensors, number lists and boxes as a list of tensors (or padded with
``pad_fields=True``), text and JSON as lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from readers.fields.field_schema import as_tensors
from readers.fields.sample_fields import FieldPlan


class FieldCollate:
    """``collate_fn`` for per-sample ``(image, target)`` pairs whose targets a ``FieldPlan`` made."""

    def __init__(self, plan: FieldPlan) -> None:
        self.plan = plan

    def __call__(self, samples: Sequence[tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]]:
        import torch
        from torch.utils.data import default_collate

        images = default_collate([image for image, _ in samples])
        targets = [target for _, target in samples]
        labels = torch.as_tensor([int(t["label"]) for t in targets], dtype=torch.int64)
        return images, as_tensors(self.plan.collate(targets, labels))


def field_collate(dataset: Any) -> FieldCollate | None:
    """The collate for a per-sample stream with fields (None: ``default_collate`` serves: no
    fields, or a ``target_transform`` that gives the targets its own shape)."""
    plan = getattr(dataset, "fields", None)
    if not isinstance(plan, FieldPlan) or getattr(dataset, "target_transform", None) is not None:
        return None
    return FieldCollate(plan)
