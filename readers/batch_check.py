"""Checking ``crop=``/``resize=`` against the stored image sizes when an iterable is created.

The packer records the range of stored heights and widths in the manifest (``stored_sizes``), so a
crop larger than some stored image, or a dataset whose images keep different sizes read as whole
batches without a crop, is reported when ``open_iterable`` is called, not as an error mid-epoch
inside a DataLoader worker. Datasets packed before the range was recorded are not checked here
(the batch assembler still reports the first image that does not fit).
"""

from __future__ import annotations

from typing import Any

from readers.errors import ImgpackError


def _fixed_pair(value: Any) -> tuple[int, int] | None:
    """(h, w) for an int or a pair; None for anything else (no size, or a random crop object)."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    return None


def check_batch_sizes(where: str, stored: dict[str, int] | None, crop: Any, resize: Any) -> None:
    """Raise ``ImgpackError`` naming the fix if batches of ``crop``/``resize`` cannot be built."""
    if not stored or not stored.get("count"):
        return
    low = (stored["min_height"], stored["min_width"])
    high = (stored["max_height"], stored["max_width"])
    crop_hw = _fixed_pair(crop)
    if resize is None:
        if crop is None and low != high:
            raise ImgpackError(
                f"{where}: a batch needs images of one size, but the stored images range from "
                f"{low[0]}x{low[1]} to {high[0]}x{high[1]} (height x width, see `pack info`); pass "
                f"crop= (and resize=) to open_iterable, e.g. crop={min(low)}, or pack with --crop N"
            )
        fits, what = low, f"the smallest stored image ({low[0]} px high, {low[1]} px wide, see `pack info`)"
    elif isinstance(resize, int):
        fits, what = (resize, resize), f"resize={resize} (the shorter side after resizing)"
    else:
        size_hw = _fixed_pair(resize)
        if size_hw is None:
            return
        fits, what = size_hw, f"resize={resize!r}"
    if crop_hw is not None and (crop_hw[0] > fits[0] or crop_hw[1] > fits[1]):
        raise ImgpackError(
            f"{where}: crop={crop!r} is larger than {what}; pass resize= to resize first "
            f"(e.g. resize={max(crop_hw)}), or a crop of at most {fits[0]}x{fits[1]}"
        )
