"""Aspect-ratio buckets: which output shape each stored image gets, and which window of it.

A bucket is an output size (height, width). ``AspectBuckets(area, multiple, max_ratio)`` makes
the sizes of about ``area`` pixels whose sides are multiples of ``multiple`` and whose long side is
at most ``max_ratio`` times the short one; ``BucketList(sizes)`` (or a plain list of (height,
width) passed as ``buckets=``) names them. An image goes to the bucket nearest its stored aspect
ratio (in log ratio, ties to the first listed), so the bucket is a function of the stored size
alone: the schedule (readers/bucketing/bucket_order.py) and the assembler agree without talking.

The image is then resized to cover the bucket and cropped by the least amount: the window of
the stored pixels with the bucket's aspect ratio that spans the whole height or the whole width,
centred, or at an offset drawn from (seed, epoch, sample index) with ``random_offset=True``
(``readers.image.geometry.sample_uniforms``, like every crop). A bucketed sample is a window + resize,
the geometry RandomResizedCrop already has, so boxes and ``"geometry"`` follow unchanged.

``leftover`` and ``group`` say how a bucket's samples are cut into batches: see bucket_order.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from readers.errors import OptionError
from readers.image.geometry import Pair, Window, as_pair

LEFTOVERS = ("pad", "drop", "carry")


@dataclass(frozen=True, kw_only=True)
class _Buckets:
    """What every bucket option shares: the leftover rule, the group, the offset."""

    leftover_rules: ClassVar[tuple[str, ...]] = LEFTOVERS  # the rules this kind of bucket takes
    leftover: str = "pad"
    group: int | None = None  # batches of one bucket in a row; None: the world size
    random_offset: bool = False

    def _check_common(self) -> None:
        if self.leftover not in self.leftover_rules:
            rules = " or ".join(repr(r) for r in self.leftover_rules)
            raise OptionError(f"buckets leftover={self.leftover!r}; use {rules}")
        if self.group is not None and (
            not isinstance(self.group, int) or isinstance(self.group, bool) or self.group < 1
        ):
            raise OptionError(f"buckets group={self.group!r} must be a positive integer (or None)")

    @property
    def sizes(self) -> tuple[Pair, ...]:
        raise NotImplementedError

    def assign(self, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """The bucket (index into ``sizes``) of each stored size: nearest in log aspect ratio."""
        return bucket_of(self.sizes, heights, widths)

    def batch_slots(self, batch_size: int | None) -> int | None:
        """The spec's batch size with this option: as given (a token budget sets its own)."""
        return batch_size

    def check_spec(self, spec: Any) -> None:
        """Refuse reading options this kind of bucket cannot honour (none here)."""

    def key(self, group: int) -> str:
        """What a resume state must match: the sizes, the rule and the group."""
        sizes = ",".join(f"{h}x{w}" for h, w in self.sizes)
        return f"{sizes};leftover={self.leftover};group={group};offset={int(self.random_offset)}"


@dataclass(frozen=True, kw_only=True)
class AspectBuckets(_Buckets):
    """Buckets of about ``area`` pixels, sides multiples of ``multiple``, ratios up to ``max_ratio``."""

    area: int = 512 * 512
    multiple: int = 64
    max_ratio: float = 4.0
    _sizes: tuple[Pair, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_common()
        for name in ("area", "multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"AspectBuckets {name}={value!r} must be a positive integer")
        if not isinstance(self.max_ratio, (int, float)) or self.max_ratio < 1:
            raise OptionError(f"AspectBuckets max_ratio={self.max_ratio!r} must be a number >= 1")
        if self.area < self.multiple**2:
            raise OptionError(
                f"AspectBuckets area={self.area} is smaller than one {self.multiple}x{self.multiple} "
                "tile (multiple=): raise area or lower multiple"
            )
        object.__setattr__(self, "_sizes", aspect_sizes(self.area, self.multiple, float(self.max_ratio)))

    @property
    def sizes(self) -> tuple[Pair, ...]:
        return self._sizes


@dataclass(frozen=True, kw_only=True)
class BucketList(_Buckets):
    """Buckets named one by one, as (height, width)."""

    bucket_sizes: tuple[Pair, ...]

    def __post_init__(self) -> None:
        self._check_common()
        given = self.bucket_sizes
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence) or not given:
            raise OptionError(f"buckets={given!r}; pass AspectBuckets(...) or a list of (height, width)")
        pairs = []
        for size in given:
            if isinstance(size, int):
                raise OptionError(f"buckets={given!r}: each bucket is a (height, width) pair, got {size!r}")
            pairs.append(as_pair(size, "buckets"))
        object.__setattr__(self, "bucket_sizes", tuple(dict.fromkeys(pairs)))

    @property
    def sizes(self) -> tuple[Pair, ...]:
        return self.bucket_sizes


Buckets = AspectBuckets | BucketList


def as_buckets(value: object) -> Any:
    """``buckets=`` as a bucket object: AspectBuckets / BucketList as given, a list as a BucketList."""
    if isinstance(value, _Buckets):  # AspectBuckets, BucketList, readers.bucketing.token_budget.TokenBudget
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return BucketList(bucket_sizes=tuple(value))  # type: ignore[arg-type]
    raise OptionError(f"buckets={value!r}; pass AspectBuckets(area=..., ...) or a list of (height, width)")


def aspect_sizes(area: int, multiple: int, max_ratio: float) -> tuple[Pair, ...]:
    """Every (h, w), sides multiples of ``multiple``, of about ``area`` pixels, ratio <= max_ratio,
    from the tallest to the widest."""
    out: dict[Pair, None] = {}
    for k in range(1, area // multiple + 1):
        h = k * multiple
        w = max(multiple, int(round(area / h / multiple)) * multiple)
        if max(h / w, w / h) <= max_ratio + 1e-9:
            out[(h, w)] = None
    return tuple(sorted(out, key=lambda s: (-s[0] / s[1], s)))


def bucket_of(sizes: Sequence[Pair], heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Index of the bucket nearest in log aspect ratio for each (height, width), int64."""
    ratios = np.log(np.asarray([h / w for h, w in sizes], dtype=np.float64))
    mine = np.log(np.asarray(heights, dtype=np.float64) / np.asarray(widths, dtype=np.float64))
    return np.argmin(np.abs(mine[:, None] - ratios[None, :]), axis=1).astype(np.int64)


def cover_window(stored: Pair, bucket: Pair, uniform: tuple[float, float] | None = None) -> Window:
    """The window of a ``stored`` (h, w) image that, resized to ``bucket``, covers it with the
    least crop: the bucket's aspect ratio, spanning the stored height or width. Centred, or placed
    by two uniforms in [0, 1) (top, left) for a random offset."""
    height, width = stored
    bh, bw = bucket
    scale = max(bh / height, bw / width)
    ch = min(height, max(1, round(bh / scale)))
    cw = min(width, max(1, round(bw / scale)))
    if uniform is None:
        return Window((height - ch) // 2, (width - cw) // 2, ch, cw)
    return Window(int(uniform[0] * (height - ch + 1)), int(uniform[1] * (width - cw + 1)), ch, cw)


def kept_fraction(stored: Pair, bucket: Pair) -> float:
    """The fraction of a stored image's area the bucket's cover window keeps."""
    w = cover_window(stored, bucket)
    return w.height * w.width / (stored[0] * stored[1])


def square_kept_fraction(stored: Pair) -> float:
    """The fraction a square centre crop keeps (short side squared over the area)."""
    return min(stored) ** 2 / (stored[0] * stored[1])


def checked_buckets(value: object, spec: Any) -> Any:
    """``buckets=`` checked against the other reading options of ``spec`` (a ReadSpec)."""
    buckets = as_buckets(value)
    if spec.crop is not None or spec.resize is not None:
        raise OptionError(
            "buckets= resizes each image to cover its bucket and crops the least: drop crop= and resize="
        )
    buckets.check_spec(spec)
    return buckets
