"""Whole batches that refuse to be batched again.

``open_iterable(batch_size=B)`` yields finished ``(images, labels)`` batches, so the DataLoader must
run with ``batch_size=None``. Its default (``batch_size=1``) would collate them once more and
silently give ``(1, B, C, H, W)`` images. What the iterable yields is therefore a ``WholeBatch``
(a plain tuple to every other consumer: unpacking, pinning, ``.to(device)`` loops) or, from a
worker, a ``readers.batch.shmring.Lease``; both are registered in torch's ``default_collate_fn_map`` (its
documented extension point) with a collate function that raises an error naming the fix, in the
main process and in worker processes alike (the registration runs on import, which workers do
when they receive the dataset).
"""

from __future__ import annotations

from typing import Any

from readers.batch.shmring import Lease
from readers.errors import ImgpackError

FIX = (
    "open_iterable(batch_size=B) already yields whole (images, labels) batches, and the DataLoader "
    "is batching them again (a DataLoader batches by default: batch_size=1). Build the loader with "
    "DataLoader(dataset, batch_size=None, ...) or readers.make_loader(dataset, ...)"
)


class WholeBatchCollatedError(ImgpackError, TypeError):
    """A DataLoader tried to collate batches that ``open_iterable`` had already assembled."""

    def __init__(self, message: str = FIX):
        # torch re-raises a worker's error in the main process as type(exc)("Caught ... in
        # DataLoader worker process N.\nOriginal Traceback ..."): keep the one line that says
        # what to do (the worker's frames are torch's collate, no help to the user).
        head, _, rest = message.partition("\n")
        if head.startswith("Caught ") and rest.startswith("Original Traceback"):
            message = f"{FIX} (raised {head.split(' ', 2)[-1].rstrip('.')})"
        super().__init__(message)


class WholeBatch(tuple):
    """``(images, labels)`` as built by a worker; a tuple that ``default_collate`` refuses."""

    __slots__ = ()


def refuse_collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    raise WholeBatchCollatedError(FIX)


def whole_batch(batch: Any) -> Any:
    """What the iterable yields for an assembled batch: a Lease stays one, a tuple is wrapped."""
    return batch if isinstance(batch, Lease) else WholeBatch(batch)


def _register() -> None:
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # pragma: no cover - a torch without the registry: no guard, no harm
        return
    default_collate_fn_map[WholeBatch] = refuse_collate
    default_collate_fn_map[Lease] = refuse_collate


_register()
