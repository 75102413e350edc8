"""What the DALI loader and its CPU fallback both consume: the batches of an epoch and their geometry.

The geometry (resize targets, centre crop offsets, random windows and flips) is the read's one
``readers.image.geometry.Geometry``, the object the batch path and the DALI fields use too (made once by
``dali_loader``, its crop fit-checked there), so the same arguments crop the same pixels.

``BatchFeed`` is the one description of an epoch for ``readers.dali``: which samples go in
batch i (from ``readers.order.epoch_order``, plus the last-batch policy), their records (the format
reader's ``read_many``), and the size every image is resized to. The DALI pipeline calls it as
an ``external_source``; the CPU fallback reads the same batches and applies the same geometry in
torch, so both paths see the same samples in the same order. It is picklable and opens the
reader lazily, so DALI's parallel external_source workers (fork or spawn) can each own one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from readers.dali._fields import OUTPUTS, carried
from readers.errors import ImgpackError, OptionError
from readers.formats import open_reader
from readers.image.geometry import Augment, Geometry, RandomResizedCrop
from readers.order.epoch_order import OrderSpec, num_chunks
from readers.spec import ReadSpec
from readers.store.record import Record

LAST_BATCH = ("pad", "drop", "partial")
# Stored as pixels (or as BMP, which NumPy parses at memcpy speed): fed to DALI without decoding.
PIXEL_ENCODINGS = ("raw", "bmp")

Size = tuple[int, int]


class Plan(NamedTuple):
    """Geometry of one batch: resize targets (centre path), windows, flips; None where unused."""

    sizes: np.ndarray | None  # (B, 2) float32 (height, width) each image is resized to
    windows: np.ndarray | None  # (B, 4) int64 (top, left, height, width) after resizing
    flips: np.ndarray | None  # (B,) bool


class BatchFeed:
    """Batch ``i`` of epoch ``e`` for one rank: its records, labels and target sizes."""

    def __init__(
        self,
        path: str | os.PathLike,
        order: OrderSpec,
        batch_size: int,
        last_batch: str = "pad",
        resize: Size | int | None = None,
        crop: Size | int | RandomResizedCrop | None = None,
        base_epoch: int = 0,
        flip: float = 0.0,
        reader_options: dict[str, Any] | None = None,
        fields: Mapping[str, str] | None = None,
        *,
        geometry: Geometry | None = None,
    ):
        """``geometry``: the read's one geometry (``ReadSpec.geometry``); without it one is made of
        ``resize``, ``crop`` and ``flip`` (checked as a spec checks them, each stored size fit-checked)."""
        if last_batch not in LAST_BATCH:
            raise OptionError(f"last_batch={last_batch!r}; use one of {', '.join(LAST_BATCH)}")
        self.path = path
        self.reader_options = dict(reader_options or {})  # open_reader's: verify, cache_dir, ...
        self.order = order
        self.batch_size = int(batch_size)
        self.last_batch = last_batch
        if geometry is None:
            geometry = ReadSpec(resize=resize, crop=crop, flip=flip, seed=order.seed).geometry()
        self.geometry = geometry
        self.base_epoch = int(base_epoch)  # DALI counts epochs from 0 after each (re)build
        # With fields=: the stored fields ({name: kind}) carried beside the pixels, with each
        # sample's geometry (readers/dali/_fields.py); {} carries the geometry alone
        self.fields = None if fields is None else dict(fields)
        self._reader: Any = None
        self._positions: tuple[int, np.ndarray] | None = None
        self.resume: tuple[int, int] | None = None  # (epoch, global position) to start that epoch at

    # -- the plan -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return num_chunks(self.order.samples_per_rank, self.batch_size, self.last_batch == "drop")

    def start(self, epoch: int) -> int:
        """The global position ``epoch`` starts at: 0, or the resume point's."""
        return self.resume[1] if self.resume is not None and self.resume[0] == epoch else 0

    def batches_in(self, epoch: int) -> int:
        """Batches this rank reads in ``epoch`` (fewer than ``len`` in a resumed epoch)."""
        return self.batches_from(epoch, self.start(epoch))

    def batches_from(self, epoch: int, position: int) -> int:
        """Batches this rank reads in ``epoch`` started at global ``position``."""
        samples = self.order.at_epoch(epoch).samples_from(position)  # carry: that epoch's length
        return num_chunks(samples, self.batch_size, self.last_batch == "drop")

    def positions(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for ``epoch``, cut or wrapped to whole batches as the policy says."""
        if self._positions is None or self._positions[0] != epoch:
            idx = self.order.epoch_order(epoch, self.start(epoch))
            wanted = self.batches_in(epoch) * self.batch_size
            if self.last_batch == "drop":
                idx = idx[:wanted]
            elif self.last_batch == "pad" and len(idx) < wanted:
                # Wraps around this rank's order of the epoch from its start (a resumed epoch pads
                # like an uninterrupted one), as readers.batch.record_stream does.
                idx = np.concatenate([idx, np.resize(self.order.epoch_order(epoch), wanted - len(idx))])
            self._positions = (epoch, idx)
        return self._positions[1]

    def batch_indices(self, epoch: int, i: int) -> np.ndarray:
        return self.positions(epoch)[i * self.batch_size : (i + 1) * self.batch_size]

    # -- the geometry (the pipeline's view of ``self.geometry``) --------------------------------
    @property
    def resize(self) -> Size | int | None:
        return self.geometry.resize

    @property
    def random_crop(self) -> RandomResizedCrop | None:
        return self.geometry.random_crop

    @property
    def crop(self) -> Size | int | RandomResizedCrop | None:
        """The centre crop, or the RandomResizedCrop: None when nothing is cropped."""
        return self.geometry.crop if self.geometry.crop is not None else self.geometry.random_crop

    @property
    def augment(self) -> Augment:
        return self.geometry.augment

    # -- reading ------------------------------------------------------------------------------
    @property
    def reader(self):
        if self._reader is None:
            self._reader = open_reader(self.path, **self.reader_options)
        return self._reader

    @property
    def encoding(self) -> str:
        return self.reader.manifest.encoding

    @property
    def channels(self) -> int:
        return 1 if self.reader.manifest.preprocess.get("mode") == "L" else 3

    def records(self, epoch: int, i: int) -> list[Record]:
        """The records of batch ``i``; ``StopIteration`` past the end of the epoch."""
        if not 0 <= i < self.batches_in(epoch):
            raise StopIteration
        return self.reader.read_many(self.batch_indices(epoch, i))

    def plan(self, records: Sequence[Record], indices: Sequence[int] | np.ndarray, epoch: int) -> Plan:
        """The geometry of a batch (checks it can be stacked): see ``Plan``."""
        geometry = self.geometry
        stored = [(r.height, r.width) for r in records]
        flips = None
        if geometry.augment.active:
            params = geometry.params(epoch, indices, stored)
            flips = np.array([f for _, f in params], dtype=bool)
            if geometry.windowed:
                windows = np.array([w for w, _ in params], dtype=np.int64).reshape(-1, 4)
                return Plan(None, windows, flips)
        placed = [geometry.placement(h, w) for h, w in stored]
        resized = [p.resized for p in placed]
        sizes = np.array(resized, np.float32).reshape(-1, 2) if geometry.resize is not None else None
        if geometry.crop is None:
            if len(set(resized)) > 1:
                distinct = sorted(set(resized))[:3]
                raise ImgpackError(
                    f"{self.path}: images in a batch have different sizes {distinct}...; "
                    "pass crop=N or resize=(height, width) so every image has one size"
                )
            return Plan(sizes, None, flips)
        windows = np.array([(p.top, p.left, *p.out) for p in placed], np.int64).reshape(-1, 4)
        return Plan(sizes, windows, flips)

    def batch(self, epoch: int, i: int) -> tuple[list[Record], Plan]:
        """Batch ``i`` of ``epoch``: its records and their geometry."""
        records = self.records(epoch, i)
        return records, self.plan(records, self.batch_indices(epoch, i), epoch)

    @property
    def window_first(self) -> bool:
        """The pipeline cuts each sample's window from the stored image (on decode), then resizes:
        a RandomResizedCrop's, or a bucket's (readers/dali/_buckets.py)."""
        return self.geometry.windowed

    @property
    def identity(self) -> dict[str, str]:
        """What a resume state must match besides the dataset and the order (readers/dali/_buckets.py)."""
        return {}

    @property
    def output_names(self) -> list[str]:
        """Outputs of the DALI callback, in order."""
        names = ["data", "labels"]
        if self.resize is not None:
            names.append("sizes")
        if self.crop is not None:
            names += ["anchor", "shape"]
        if self.augment.flip > 0:
            names.append("mirror")
        if self.fields is not None:
            names += OUTPUTS
        return names

    def __call__(self, info: Any) -> tuple[Any, ...]:
        """DALI ``external_source`` callback (``batch=True, batch_info=True``): see ``output_names``."""
        epoch = self.base_epoch + info.epoch_idx
        records, plan = self.batch(epoch, info.iteration)
        if self.encoding in PIXEL_ENCODINGS:
            from readers.image.decode import decode_array, naming_decode_errors

            indices = self.batch_indices(epoch, info.iteration)
            decoded = (decode_array(r) for r in records)
            data = list(naming_decode_errors(decoded, self.reader, indices, records))
        else:
            data = [np.frombuffer(r.data, dtype=np.uint8) for r in records]
        windows = plan.windows if plan.windows is not None else np.zeros((len(records), 4), np.int64)
        flips = plan.flips if plan.flips is not None else np.zeros(len(records), bool)
        outputs = {
            "data": data,
            "labels": np.array([r.label for r in records], dtype=np.int64),
            "sizes": plan.sizes,
            "anchor": windows[:, :2].astype(np.float32),
            "shape": windows[:, 2:].astype(np.float32),
            "mirror": flips.astype(np.int32),
        }
        if self.fields is not None:
            outputs.update(zip(OUTPUTS, carried(records, self.fields, windows, flips)))
        return tuple(outputs[name] for name in self.output_names)

    # -- pickling (parallel external_source workers, DataLoader workers) -----------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_positions"] = None
        return state
