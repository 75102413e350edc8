"""Image geometry, in one place: resize targets, rounding, centre crops, random crop windows, flips.

The packer, the batch path (``readers.batch.batch_assembler``), the DALI pipeline and its CPU fallback all
take their numbers from here, so equal arguments give equal windows on every path.

The rounding rule:

- a resized size is ``round(x)`` (nearest integer, ties to even, as Python rounds) and at least 1;
  ``resize=N`` scales the shorter side to exactly N and rounds the other side that way;
- a centre crop of (h, w) from an image of (H, W) starts at ``((H - h) // 2, (W - w) // 2)``:
  the margin halved, rounded down, so an odd margin leaves the extra pixel at the bottom/right;
- random windows (``RandomResizedCrop``) are whole pixels by construction.

Random parameters are a pure function of ``(seed, epoch, global sample index)``: each is a
uniform number from a counter-based generator (the SplitMix64 finaliser applied to a key made of
the seed and epoch plus a counter made of the sample index and the draw number), never state
carried by a worker, so any worker count, rank split or mid-epoch resume sees the same window and
flip for the same sample. A whole batch's numbers come from one vectorised NumPy call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from readers.errors import OptionError
from readers.fields.boxes import SampleGeometry, geometry_for_resize_crop, geometry_for_window

Pair = tuple[int, int]
MASK64 = (1 << 64) - 1
TRIES = 10  # torchvision's RandomResizedCrop tries 10 windows before the centre fallback
DRAWS = 1 + 4 * TRIES  # uniforms per sample: the flip, then four per try


class Window(NamedTuple):
    """A rectangle of whole pixels: top-left corner and size."""

    top: int
    left: int
    height: int
    width: int


def as_pair(value: int | Sequence[int], name: str) -> Pair:
    """An int N as (N, N), or an (height, width) pair; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        pair: tuple[int, ...] = (int(value), int(value))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        pair = tuple(int(v) for v in value)
    else:
        raise OptionError(f"{name}={value!r}; use a positive int or (height, width)")
    if len(pair) != 2 or min(pair) < 1:
        raise OptionError(f"{name}={value!r}; use a positive int or (height, width)")
    return pair  # type: ignore[return-value]


def round_size(x: float) -> int:
    """The one rounding rule for sizes: nearest integer, ties to even, at least 1."""
    return max(1, round(x))


def resized_size(height: int, width: int, size: int | Pair | None, *, longer: bool = False) -> Pair:
    """(height, width) after ``size``: None keeps it, an int scales the shorter side (the longer
    one with ``longer``, the packer's ``--resize-mode longer``) to it, a pair is exact. The one
    size rule of the packer and every reader."""
    if size is None:
        return height, width
    if not isinstance(size, int):
        return size
    if (height <= width) != longer:
        return size, round_size(width * size / height)
    return round_size(height * size / width), size


def crop_fits(where: str, crop: int | Pair, size: Pair, what: str) -> None:
    """The one crop-fit check: ``OptionError`` naming the fix if ``crop`` (as the user gave it, an
    int N or a checked (h, w)) exceeds ``size`` (h, w), an image (or the smallest one a dataset
    stores) described by ``what``. ``Geometry`` calls it, once per read."""
    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    if ch > size[0] or cw > size[1]:
        raise OptionError(
            f"{where}: crop={crop!r} is larger than {what}; pass resize= to resize first "
            f"(e.g. resize={max(ch, cw)}), or a crop of at most {size[0]}x{size[1]}"
        )


def centre_window(height: int, width: int, crop: Pair) -> Window:
    """The centre ``crop`` of an image of height x width (offsets rounded down)."""
    ch, cw = crop
    return Window((height - ch) // 2, (width - cw) // 2, ch, cw)


def scaled_window(window: Window, scale: tuple[float, float], shape: Pair) -> Window:
    """``window`` in an image scaled by (sy, sx) to ``shape``: edges rounded, at least one pixel."""
    sy, sx = scale
    top, left = min(round(window.top * sy), shape[0] - 1), min(round(window.left * sx), shape[1] - 1)
    bottom = min(shape[0], max(top + 1, round((window.top + window.height) * sy)))
    right = min(shape[1], max(left + 1, round((window.left + window.width) * sx)))
    return Window(top, left, bottom - top, right - left)


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random window of the stored image, resized to ``size``: torchvision's RandomResizedCrop.

    The window covers a fraction of the area drawn uniformly from ``scale`` with an aspect ratio
    (width / height) log-uniform in ``ratio``; up to 10 tries, then a centre crop of the image
    clamped to ``ratio``. Pass it as ``crop=`` to ``open_iterable`` or ``dali_loader``.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", as_pair(self.size, "size"))
        scale = _float_pair(self.scale, "scale")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise OptionError(f"scale={self.scale!r}; use (min, max) with 0 < min <= max <= 1")
        ratio = _float_pair(self.ratio, "ratio")
        if not 0 < ratio[0] <= ratio[1]:
            raise OptionError(f"ratio={self.ratio!r}; use (min, max) with 0 < min <= max")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)

    @property
    def out(self) -> Pair:
        return self.size  # type: ignore[return-value]

    def window(self, height: int, width: int, uniforms: Sequence[float]) -> Window:
        """One window of an image of height x width (torchvision's ``get_params`` algorithm).

        ``uniforms``: ``4 * TRIES`` numbers in [0, 1), four per try (area, ratio, top, left).
        """
        area = height * width
        (s_lo, s_hi), (r_lo, r_hi) = self.scale, (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for t in range(TRIES):
            u_area, u_ratio, u_top, u_left = uniforms[4 * t : 4 * t + 4]
            target = area * (s_lo + (s_hi - s_lo) * u_area)
            aspect = math.exp(r_lo + (r_hi - r_lo) * u_ratio)
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(u_top * (height - h + 1))  # uniform integer in [0, height - h]
                left = int(u_left * (width - w + 1))
                return Window(top, left, h, w)
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return Window((height - h) // 2, (width - w) // 2, h, w)


def _float_pair(value: Sequence[float], name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise OptionError(f"{name}={value!r}; use a (min, max) pair of numbers") from None
    return lo, hi


def flip_probability(flip: bool | float | None) -> float:
    """``flip=`` as a probability: False/None 0, True 0.5, a number in [0, 1] as given."""
    if flip is None or flip is False:
        return 0.0
    if flip is True:
        return 0.5
    try:
        p = float(flip)
    except (TypeError, ValueError):
        raise OptionError(f"flip={flip!r}; use True, False or a probability in [0, 1]") from None
    if not 0 <= p <= 1:
        raise OptionError(f"flip={flip!r}; use True, False or a probability in [0, 1]")
    return p


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijective 64-bit hash with good avalanche (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, epoch: int, indices: Sequence[int] | np.ndarray, draws: int = DRAWS):
    """(len(indices), draws) float64 uniforms in [0, 1), a pure function of (seed, epoch, index, draw)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    key = _mix(np.array([int(seed) & MASK64], np.uint64) + golden)
    key = _mix(key ^ np.array([int(epoch) & MASK64], np.uint64))
    first = np.asarray(indices, dtype=np.int64).astype(np.uint64)[:, None] * np.uint64(draws)
    counter = first + np.arange(draws, dtype=np.uint64)
    bits = _mix(_mix(counter * golden + key))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Augment:
    """Per-sample random geometry: a ``RandomResizedCrop`` window (or none) and a flip."""

    crop: RandomResizedCrop | None
    flip: float
    seed: int

    @property
    def active(self) -> bool:
        return self.crop is not None or self.flip > 0

    def params(
        self, epoch: int, indices: Sequence[int] | np.ndarray, sizes: Sequence[tuple[int, int]]
    ) -> list[tuple[Window | None, bool]]:
        """(window, flip) of each sample ``indices[i]`` stored at ``sizes[i]`` (height, width).

        The flip uses the first number, so the window does not depend on the flip probability.
        """
        if len(indices) != len(sizes):
            raise ValueError(f"{len(indices)} sample indices for {len(sizes)} images")
        if not len(indices):
            return []
        rows = sample_uniforms(self.seed, epoch, indices).tolist()
        out = []
        for row, (height, width) in zip(rows, sizes):
            window = self.crop.window(height, width, row[1:]) if self.crop is not None else None
            out.append((window, row[0] < self.flip))
        return out


NO_AUGMENT = Augment(None, 0.0, 0)
Params = tuple[Window | None, bool]  # a sample's random window (None: the centre path) and flip
NO_PARAMS: Params = (None, False)


Stored = Mapping[str, int] | None  # a manifest's stored_sizes: None when not recorded


class Placement(NamedTuple):
    """Where an image of one stored size lands in the output (the centre path)."""

    resized: Pair  # (h, w) after ``resize``
    top: int
    left: int
    out: Pair  # (h, w) written into the batch


class GeometryOptions(Protocol):
    """What ``Geometry.of`` reads of a ``readers.spec.ReadSpec`` (checked and normalised there)."""

    @property
    def crop(self) -> int | Pair | RandomResizedCrop | None: ...
    @property
    def resize(self) -> int | Pair | None: ...
    @property
    def flip(self) -> bool | float: ...
    @property
    def seed(self) -> int: ...


@dataclass(frozen=True)
class Geometry:
    """The geometry of one read, made once (``Geometry.of``) and shared by everything that applies it:
    the batch and per-sample paths (``readers.batch.batch_assembler``), the DALI feed and the DALI fields.

    It holds the options as ``ReadSpec`` normalised them, has fit-checked the centre crop once
    against the stored sizes, and gives each stored size its ``Placement`` (memoised: batches
    repeat sizes), each sample its random (window, flip) and the geometry its boxes follow.
    """

    crop: int | Pair | None = None  # a centre crop as given: N (square) or (h, w)
    resize: int | Pair | None = None
    augment: Augment = NO_AUGMENT
    # True when the check in ``of`` covered every image (stored sizes known, or a resize that fixes
    # the shorter side); else a dataset packed before stored sizes were recorded: checked per size.
    fits_all: bool = False
    where: str = "a batch"  # what a per-size refusal names
    _placements: dict[Pair, Placement] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, options: GeometryOptions, stored: Sequence[tuple[str, Stored]] = ()) -> Geometry:
        """The geometry of ``options`` (a ``ReadSpec``) over datasets whose ``stored`` sizes are
        ``(where, manifest.stored_sizes)`` each: refuses, naming the fix, a centre crop larger than
        the smallest stored image (after ``resize``) of any of them."""
        crop = options.crop
        random_crop = crop if isinstance(crop, RandomResizedCrop) else None
        centre = None if isinstance(crop, RandomResizedCrop) else crop
        augment = Augment(random_crop, float(options.flip), int(options.seed))
        where = stored[0][0] if len(stored) == 1 else "a batch"
        fits_all = centre is None or options.resize is not None
        if centre is not None and options.resize is not None:  # one check for every image there is
            resize, first = options.resize, stored[0][0] if stored else where
            if isinstance(resize, int):
                what = f"resize={resize} (the shorter side after resizing)"
                crop_fits(first, centre, (resize, resize), what)
            else:
                crop_fits(first, centre, resize, f"resize={resize!r}")
        elif centre is not None:
            known = [(name, sizes) for name, sizes in stored if sizes and sizes.get("count")]
            fits_all = len(known) == len(stored) > 0
            for name, sizes in known:
                low = (sizes["min_height"], sizes["min_width"])
                what = f"the smallest stored image ({low[0]} px high, {low[1]} px wide, see `pack info`)"
                crop_fits(name, centre, low, what)
        return cls(centre, options.resize, augment, fits_all, where)

    @property
    def random_crop(self) -> RandomResizedCrop | None:
        return self.augment.crop

    @property
    def windowed(self) -> bool:
        """True when every sample has a window of its own (``params`` draws it), not the centre path."""
        return self.augment.crop is not None

    @property
    def crop_size(self) -> Pair | None:
        """The centre crop as (h, w)."""
        crop = self.crop
        return None if crop is None else (crop, crop) if isinstance(crop, int) else crop

    def placement(self, height: int, width: int) -> Placement:
        """Where an image stored at height x width lands (random crops: only the output is fixed)."""
        placed = self._placements.get((height, width))
        if placed is None:
            placed = self._placements[(height, width)] = self._place(height, width)
        return placed

    def _place(self, height: int, width: int) -> Placement:
        if self.augment.crop is not None:
            return Placement((height, width), 0, 0, self.augment.crop.out)
        resized = resized_size(height, width, self.resize)
        crop = self.crop_size
        if crop is None:
            return Placement(resized, 0, 0, resized)
        if not self.fits_all:
            assert self.crop is not None
            what = f"an image of {resized[0]}x{resized[1]} (stored {height}x{width})"
            crop_fits(self.where, self.crop, resized, what)
        top, left, _, _ = centre_window(*resized, crop)
        return Placement(resized, top, left, crop)

    def params(
        self, epoch: int, indices: Sequence[int] | np.ndarray | None, sizes: Sequence[Pair]
    ) -> list[Params]:
        """Each sample's (window, flip), from its global sample index: random when augmenting."""
        if not self.augment.active:
            return [NO_PARAMS] * len(sizes)
        if indices is None:
            raise ValueError("random crops and flips need the global sample index of every record")
        return self.augment.params(epoch, indices, sizes)

    def sample_geometries(self, sizes: Sequence[Pair], params: Sequence[Params]) -> list[SampleGeometry]:
        """The exact geometry each image stored at ``sizes[i]`` goes through with its ``params``:
        its stored size, the window of it that becomes the output, the output size and the flip;
        what boxes follow (readers/fields/boxes.py)."""
        out: list[SampleGeometry] = []
        for stored, (window, flip) in zip(sizes, params):
            placed = self.placement(*stored)
            if window is not None:
                out.append(geometry_for_window(stored, tuple(window), placed.out, flip))
            else:
                cut = (placed.top, placed.left, *placed.out)
                out.append(geometry_for_resize_crop(stored, placed.resized, cut, placed.out, flip))
        return out
