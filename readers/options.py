"""Reading options shared by ``open_iterable``, ``mix`` and ``dali_loader``: checks and old names.

One knob has one name on every reading path (``resize``, ``crop``, ``flip``, ``layout``,
``drop_last``, ``verify``, ``reader_options``, ...). An option a path cannot honour is an error
naming what to pass instead, never silently ignored.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

LAYOUTS = ("CHW", "HWC")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use 'CHW' or 'HWC'")
    return layout


def check_batch_options(
    batch_size: int | None,
    *,
    decode: str,
    transform: Callable | None,
    target_transform: Callable | None = None,
    batch_transform: Callable | None = None,
    decode_threads: int = 0,
) -> None:
    """Reject options the chosen mode (whole batches, or one sample at a time) cannot honour."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if batch_size is None:
        if decode_threads:
            raise ValueError("decode_threads= applies to whole batches: also pass batch_size=")
        if batch_transform is not None:
            raise ValueError("batch_transform= applies to whole batches: also pass batch_size=")
        return
    if decode != "tensor":
        raise ValueError(
            f"decode={decode!r} applies to single samples, but with batch_size= the workers build "
            "uint8 tensor batches: drop decode= (or batch_size= to get each sample as "
            f"{decode!r})"
        )
    if transform is not None:
        raise ValueError(
            "transform= is applied to each image, but with batch_size= the workers build whole "
            "(B, C, H, W) batches: pass batch_transform= for a function of the whole batch (one "
            "call, e.g. normalisation), or drop batch_size= to transform each image"
        )
    if target_transform is not None:
        raise ValueError(
            "target_transform= is applied to each label, but with batch_size= labels arrive as one "
            "int64 tensor per batch: transform that tensor in the training loop, or drop batch_size= "
            "to transform each label"
        )


def renamed(where: str, old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of option ``new``, taken from its old name ``old`` with a DeprecationWarning."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{where}: pass {new}= only ({old}= is its old name)")
    warnings.warn(
        f"{where}({old}=...) is now {new}=...; the old name will be removed in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value
