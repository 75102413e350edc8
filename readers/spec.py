"""The reading options, as one validated object: what ``open_iterable``, ``mix`` and ``dali_loader`` take.

Every entry point builds a ``ReadSpec`` from its keyword arguments (``ReadSpec.build``), so one knob
has one name, one default and one check on every path, and a mistake is an ``OptionError`` raised
when the entry point is called, with the same message on every path. What a spec can only check
against the data (a crop larger than the smallest stored image, whole batches of images that keep
different sizes) is checked by ``geometry``, which each entry point calls once with the stored sizes
of the datasets it opens: the ``readers.image.geometry.Geometry`` it returns is the read's one geometry.

``ENTRY_POINTS`` says which entry points take each option: the table of reading options in docs/reading.md
is tested against it.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from readers.bucketing.bucket_geometry import bucket_geometry
from readers.bucketing.buckets import checked_buckets
from readers.errors import CallError, OptionError
from readers.fields.targets import check_target
from readers.image.decode import check_decode_kind
from readers.image.geometry import Geometry, RandomResizedCrop, as_pair, flip_probability
from readers.order.epoch_order import OrderSpec, resolve_rank
from readers.remote.readahead import resolve_budget
from readers.remote.remote_parts import merge_remote_options

LAYOUTS = ("CHW", "HWC")
Size = int | tuple[int, int] | None
Crop = int | tuple[int, int] | RandomResizedCrop | None

ITERABLES = ("open_iterable", "mix")
EVERY_PATH = (*ITERABLES, "dali_loader")
# open_dataset: the map-style Dataset, one sample per index (no order, batches or geometry).
PER_SAMPLE = (*ITERABLES, "open_dataset")
OPENING = (*EVERY_PATH, "open_dataset")  # where the bytes come from and how they are checked


def _option(default: Any, paths: tuple[str, ...] = EVERY_PATH) -> Any:
    return field(default=default, metadata={"paths": paths})


@dataclass(frozen=True, kw_only=True)
class ReadSpec:
    """How to read: order, ranks, batches, geometry, decoding and where the bytes come from."""

    shuffle: bool = _option(True)
    seed: int = _option(0)
    batch_size: int | None = _option(None)
    rank: int | None = _option(None)
    world_size: int | None = _option(None)
    drop_last: bool = _option(False)
    pad_last: bool = _option(False)
    block_size: int = _option(64)
    buffer_size: int = _option(4096)
    layout: str = _option("CHW")
    crop: Crop = _option(None)
    resize: Size = _option(None)
    flip: bool | float = _option(False)
    # open_dataset's default is "pil" (torchvision's datasets hand out PIL images), with target=: "tensor"
    decode: str = _option("tensor", PER_SAMPLE)
    transform: Callable | None = _option(None, PER_SAMPLE)
    target_transform: Callable | None = _option(None, PER_SAMPLE)
    batch_transform: Callable | None = _option(None, ITERABLES)
    loader_batch_size: int | None = _option(None, ITERABLES)
    decode_threads: int = _option(0, ITERABLES)
    fast_dct: bool = _option(False, ITERABLES)
    dct_scaling: bool = _option(True, ITERABLES)
    verify: bool = _option(False, OPENING)
    cache: str | None = _option(None, ("open_dataset",))  # "ram": decoded-once bytes kept in memory
    # Per-sample fields to return (readers/fields/field_schema.py): the target becomes
    # {"label": ..., name: ...}.
    fields: tuple[str, ...] | None = _option(None, OPENING)
    # mix only: one list of field names per dataset (paths order); the target also says "dataset".
    fields_per_dataset: tuple[tuple[str, ...], ...] | None = _option(None, ("mix",))
    pad_fields: bool = _option(False)  # variable-length fields of a batch as one padded tensor + counts
    min_visibility: float = _option(0.0)  # a box keeping less of its area after a crop is dropped
    # Batches at the images' own aspect ratios (readers/bucketing/buckets.py,
    # readers/bucketing/bucket_order.py).
    buckets: Any = _option(None, ("open_iterable", "mix", "dali_loader"))  # in DALI: readers/dali/_buckets.py
    # "torchvision": (image, {"boxes": XYXY, "labels", ...}) samples, list batches (readers/fields/targets.py)
    target: str | None = _option(None, PER_SAMPLE)
    label_offset: int = _option(1, PER_SAMPLE)  # labels = class index + label_offset (0: background)
    masks: bool = _option(False, PER_SAMPLE)  # with target=: COCO segmentations as (N, H, W) masks
    reader_options: dict[str, Any] | None = _option(None, OPENING)
    storage_options: dict[str, Any] | None = _option(None, OPENING)
    cache_dir: str | os.PathLike | None = _option(None, OPENING)
    cache_size: int | None = _option(None, OPENING)
    # Bytes hinted ahead of the reads per process (readers/remote/readahead.py): None = the environment's
    # IMGPACK_READAHEAD_BYTES or 16 MiB; 0 = off. Never changes what is read.
    readahead: int | str | None = _option(None, ITERABLES)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.layout not in LAYOUTS:
            raise OptionError(f"layout={self.layout!r}; use 'CHW' or 'HWC'")
        check_decode_kind(self.decode)
        if self.cache not in (None, "ram"):
            raise OptionError(f"cache={self.cache!r}; use None or 'ram'")
        for name in ("batch_size", "loader_batch_size", "block_size", "buffer_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise OptionError(f"{name} must be a positive integer, got {value!r}")
        if self.decode_threads < 0:
            raise OptionError(
                f"decode_threads={self.decode_threads} must be 0 (decode in the worker) or more"
            )
        if self.crop is not None and not isinstance(self.crop, RandomResizedCrop):
            set_(self, "crop", _size(self.crop, "crop"))
        if self.resize is not None:
            set_(self, "resize", _size(self.resize, "resize"))
        set_(self, "flip", flip_probability(self.flip))
        if isinstance(self.crop, RandomResizedCrop) and self.resize is not None:
            raise OptionError(
                "resize= scales images before a centre crop; RandomResizedCrop resizes its window "
                "to its own size, so drop resize="
            )
        if self.drop_last and self.pad_last:
            raise OptionError(
                "pad_last=True fills a short last batch, which drop_last=True leaves out: pass one"
            )
        self._check_fields()
        if self.buckets is not None:
            set_(self, "buckets", checked_buckets(self.buckets, self))
            set_(self, "batch_size", self.buckets.batch_slots(self.batch_size))  # a TokenBudget sets it
        check_target(self.target, self.label_offset, self.layout, self.decode)
        if self.masks and self.target is None:
            raise OptionError("masks=True adds masks to target='torchvision' targets: also pass target=")
        self._check_mode()
        set_(self, "readahead", resolve_budget(self.readahead))
        # One dict for the format reader: reader_options plus the remote options given directly.
        remote = {
            "storage_options": self.storage_options,
            "cache_dir": self.cache_dir,
            "cache_size": self.cache_size,
        }
        try:
            merged = merge_remote_options(self.reader_options, **remote)
        except ValueError as exc:
            raise OptionError(str(exc)) from exc
        set_(self, "reader_options", merged)

    def _check_fields(self) -> None:
        if self.fields is not None:
            names = [self.fields] if isinstance(self.fields, str) else self.fields
            if not all(isinstance(n, str) and n for n in names):
                raise OptionError(f"fields= is a list of field names, got {self.fields!r}")
            object.__setattr__(self, "fields", tuple(names))
        elif self.pad_fields and self.fields_per_dataset is None:
            raise OptionError("pad_fields= pads the fields a batch returns: also pass fields=[...]")
        if self.fields_per_dataset is not None:
            if self.fields is not None:
                raise OptionError(
                    "fields= names the fields every dataset of a mix stores; fields_per_dataset= names "
                    "each dataset's own: pass one of them"
                )
            lists = self.fields_per_dataset
            if isinstance(lists, (str, dict)) or not all(
                isinstance(names, (list, tuple)) and all(isinstance(n, str) and n for n in names)
                for names in lists
            ):
                raise OptionError(
                    "fields_per_dataset= is one list of field names per dataset, in the order of the "
                    f"paths (like weights=), e.g. [['caption'], ['boxes', 'categories']]; got {lists!r}"
                )
            object.__setattr__(self, "fields_per_dataset", tuple(tuple(names) for names in lists))
        if not isinstance(self.min_visibility, (int, float)) or not 0.0 <= self.min_visibility <= 1.0:
            raise OptionError(f"min_visibility={self.min_visibility!r} must be a fraction from 0 to 1")

    def _check_mode(self) -> None:
        """Options the chosen mode (whole batches, or one sample at a time) cannot honour."""
        if self.batch_size is None:
            for name in ("decode_threads", "batch_transform", "pad_last"):
                if getattr(self, name):
                    raise OptionError(f"{name}= applies to whole batches: also pass batch_size=")
            if self.geometric and self.decode == "bytes":
                raise OptionError(
                    "crop=, resize= and flip= need decoded images: decode='tensor', 'numpy' or 'pil'"
                )
            return
        if self.loader_batch_size is not None:
            raise OptionError(
                "loader_batch_size= is for the per-sample path; with batch_size= the DataLoader must "
                "run with batch_size=None"
            )
        if self.decode != "tensor":
            raise OptionError(
                f"decode={self.decode!r} applies to single samples, but with batch_size= the workers "
                "build uint8 tensor batches: drop decode= (or batch_size= to get each sample as "
                f"{self.decode!r})"
            )
        if self.transform is not None:
            raise OptionError(
                "transform= is applied to each image, but with batch_size= the workers build whole "
                "(B, C, H, W) batches: pass batch_transform= for a function of the whole batch (one "
                "call, e.g. normalisation), or drop batch_size= to transform each image"
            )
        if self.target_transform is not None:
            raise OptionError(
                "target_transform= is applied to each label, but with batch_size= labels arrive as "
                "one int64 tensor per batch: transform that tensor in the training loop, or drop "
                "batch_size= to transform each label"
            )

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(cls, where: str, options: dict[str, Any]) -> ReadSpec:
        """The spec of entry point ``where`` from its keyword arguments: unknown names and options
        ``where`` does not take are errors naming the entry points that do take them."""
        options = dict(options)
        if "size" in options:
            options["resize"] = renamed(where, "size", options.pop("size"), "resize", options.get("resize"))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in options:
            if name not in fields:
                raise CallError(f"{where}() got an unexpected keyword argument {name!r}")
            paths = fields[name].metadata["paths"]
            if where not in paths:
                takers = " and ".join([", ".join(paths[:-1]), paths[-1]] if len(paths) > 1 else paths)
                raise OptionError(f"{name}= applies to {takers}, not to {where}: leave it out")
        if where == "open_dataset" and options.get("decode") is None:
            options["decode"] = "pil" if options.get("target") is None else "tensor"
        return cls(**options)

    # -- what follows from it ---------------------------------------------------------------
    @property
    def open_options(self) -> dict[str, Any]:
        """Keyword arguments of ``readers.formats.open_reader`` (``verify`` and ``reader_options``)."""
        return {"verify": self.verify, **(self.reader_options or {})}

    def order_of(self, num_samples: int, *, shuffle: bool | None = None, unit: int = 1) -> OrderSpec:
        """The order this spec reads ``num_samples`` in, for this process's rank (``shuffle``
        overrides the spec's: a mix deals out an already shuffled sequence)."""
        rank, world_size = resolve_rank(self.rank, self.world_size)
        shuffle = self.shuffle if shuffle is None else shuffle
        return OrderSpec(num_samples, shuffle, self.seed, self.block_size, self.buffer_size, rank, world_size,
                         self.drop_last, unit)  # fmt: skip

    @property
    def geometric(self) -> bool:
        """True when images go through the batch geometry (crop, resize or a flip)."""
        return self.crop is not None or self.resize is not None or bool(self.flip) or self.buckets is not None

    @property
    def random_crop(self) -> RandomResizedCrop | None:
        return self.crop if isinstance(self.crop, RandomResizedCrop) else None

    def check_stored(self, where: str, stored: dict[str, int] | None) -> None:
        """Refuse, naming the fix, whole batches of images that keep different sizes. ``stored``:
        the manifest's ``stored_sizes`` (None for datasets packed before it was recorded: checked
        per batch). The crop's fit is the geometry's check (``geometry``)."""
        if not stored or not stored.get("count"):
            return
        low = (stored["min_height"], stored["min_width"])
        high = (stored["max_height"], stored["max_width"])
        if self.batch_size is not None and self.resize is None and self.crop is None and low != high and (
            self.buckets is None
        ):
            raise OptionError(
                f"{where}: a batch needs images of one size, but the stored images range from "
                f"{low[0]}x{low[1]} to {high[0]}x{high[1]} (height x width, see `pack info`); pass "
                f"crop= (and resize=), e.g. crop={min(low)}, or pack with --crop N"
            )

    def geometry(self, stored: Sequence[tuple[str, dict[str, int] | None]] = ()) -> Geometry:
        """The one ``readers.image.geometry.Geometry`` of a read of datasets with these ``stored`` sizes
        ((where, manifest.stored_sizes) each), after ``check_stored`` on each: the crop is
        fit-checked there, once. A bucketed read's is a ``readers.bucketing.bucket_geometry.BucketGeometry``
        (a token budget's a ``TokenGeometry``)."""
        for where, sizes in stored:
            self.check_stored(where, sizes)
        if self.buckets is not None:
            return bucket_geometry(self.buckets, float(self.flip), self.seed)
        return Geometry.of(self, stored)


def _size(value: Any, name: str) -> int | tuple[int, int]:
    """An int stays an int (resize: the shorter side), a pair becomes a tuple; checked."""
    pair = as_pair(value, name)
    return pair[0] if isinstance(value, int) else pair


def combined_sizes(stored: Sequence[dict[str, int] | None]) -> dict[str, int] | None:
    """The stored-size range of several datasets together (None if one does not record it)."""
    if not stored or any(not s or not s.get("count") for s in stored):
        return None
    ranges = [s for s in stored if s is not None]
    return {
        "count": sum(s["count"] for s in ranges),
        "min_height": min(s["min_height"] for s in ranges),
        "min_width": min(s["min_width"] for s in ranges),
        "max_height": max(s["max_height"] for s in ranges),
        "max_width": max(s["max_width"] for s in ranges),
    }


def renamed(where: str, old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of option ``new``, taken from its old name ``old`` with a DeprecationWarning."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise CallError(f"{where}: pass {new}= only ({old}= is its old name)")
    warnings.warn(
        f"{where}({old}=...) is now {new}=...; the old name will be removed in the next release",
        DeprecationWarning,
        stacklevel=4,
    )
    return old_value


def entry_points() -> dict[str, tuple[str, ...]]:
    """Each reading option and the entry points that take it (the source of docs/reading.md's table)."""
    return {f.name: f.metadata["paths"] for f in dataclasses.fields(ReadSpec)}
