"""What the DALI loader and its CPU fallback both consume: the batches of an epoch and their geometry.

``BatchFeed`` is the one description of an epoch for ``readers.dali``: which samples go in
batch i (from ``readers.order``, plus the last-batch policy), their records (the format
reader's ``read_many``), and the size every image is resized to. The DALI pipeline calls it as
an ``external_source``; the CPU fallback reads the same batches and applies the same geometry in
torch, so both paths see the same samples in the same order. It is picklable and opens the
reader lazily, so DALI's parallel external_source workers (fork or spawn) can each own one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.order import OrderSpec, num_chunks
from readers.record import Record

LAST_BATCH = ("pad", "drop", "partial")
# Stored as pixels (or as BMP, which NumPy parses at memcpy speed): fed to DALI without decoding.
PIXEL_ENCODINGS = ("raw", "bmp")

Size = tuple[int, int]


def as_size(value: int | Sequence[int] | None, name: str) -> Size | int | None:
    """``None``, an int (resize: shorter side; crop: square) or an (height, width) pair."""
    if value is None:
        return None
    if isinstance(value, int | np.integer):
        if value < 1:
            raise ValueError(f"{name}={value} must be a positive number of pixels")
        return int(value)
    pair = tuple(int(v) for v in value)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{name}={value!r}; use N or (height, width) with positive sizes")
    return pair


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def resized_size(height: int, width: int, resize: Size | int | None) -> Size:
    """(height, width) after ``resize``: an int scales the shorter side to it, a pair is exact."""
    if resize is None:
        return height, width
    if isinstance(resize, tuple):
        return resize
    scale = resize / min(height, width)
    return max(1, round_half_up(height * scale)), max(1, round_half_up(width * scale))


def crop_box(height: int, width: int, crop: Size | int | None) -> tuple[int, int, int, int]:
    """(top, left, crop_height, crop_width) of the centre crop, positioned the way DALI's
    ``crop_pos_x=crop_pos_y=0.5`` does (the offset is rounded half up)."""
    if crop is None:
        return 0, 0, height, width
    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    return (height - ch + 1) // 2, (width - cw + 1) // 2, ch, cw


class BatchFeed:
    """Batch ``i`` of epoch ``e`` for one rank: its records, labels and target sizes."""

    def __init__(
        self,
        path: str | os.PathLike,
        order: OrderSpec,
        batch_size: int,
        last_batch: str = "pad",
        resize: Size | int | None = None,
        crop: Size | int | None = None,
        base_epoch: int = 0,
    ):
        if last_batch not in LAST_BATCH:
            raise ValueError(f"last_batch={last_batch!r}; use one of {', '.join(LAST_BATCH)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        self.path = path
        self.order = order
        self.batch_size = int(batch_size)
        self.last_batch = last_batch
        self.resize = resize
        self.crop = crop
        self.base_epoch = int(base_epoch)  # DALI counts epochs from 0 after each (re)build
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
        samples = self.order.samples_from(self.start(epoch))
        return num_chunks(samples, self.batch_size, self.last_batch == "drop")

    def positions(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for ``epoch``, cut or wrapped to whole batches as the policy says."""
        if self._positions is None or self._positions[0] != epoch:
            idx = self.order.epoch_order(epoch, self.start(epoch))
            wanted = self.batches_in(epoch) * self.batch_size
            if self.last_batch == "drop":
                idx = idx[:wanted]
            elif self.last_batch == "pad" and len(idx):
                idx = np.resize(idx, wanted)  # wraps around this rank's order
            self._positions = (epoch, idx)
        return self._positions[1]

    def batch_indices(self, epoch: int, i: int) -> np.ndarray:
        return self.positions(epoch)[i * self.batch_size : (i + 1) * self.batch_size]

    # -- reading ------------------------------------------------------------------------------
    @property
    def reader(self):
        if self._reader is None:
            self._reader = open_reader(self.path)
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

    def target_sizes(self, records: Sequence[Record]) -> np.ndarray:
        """(B, 2) float32 (height, width) each image is resized to; checks the batch can be stacked."""
        sizes = np.array([resized_size(r.height, r.width, self.resize) for r in records], np.float32)
        if len(sizes) == 0:
            return sizes.reshape(0, 2)
        if self.crop is not None:
            _, _, ch, cw = crop_box(0, 0, self.crop)
            small = np.flatnonzero((sizes[:, 0] < ch) | (sizes[:, 1] < cw))
            if len(small):
                h, w = sizes[small[0]].astype(int)
                raise ImgpackError(
                    f"{self.path}: an image is {h}x{w} after resizing, smaller than crop={self.crop}; "
                    "pass a larger resize (or a smaller crop)"
                )
        elif len(distinct := np.unique(sizes, axis=0).astype(int)) > 1:
            raise ImgpackError(
                f"{self.path}: images in a batch have different sizes {distinct[:3].tolist()}...; "
                "pass crop=N or resize=(height, width) so every image has one size"
            )
        return sizes

    @property
    def num_outputs(self) -> int:
        """Outputs of the DALI callback: data, labels, and the target sizes when resizing."""
        return 2 if self.resize is None else 3

    def __call__(self, info: Any) -> tuple[Any, ...]:
        """DALI ``external_source`` callback (``batch=True, batch_info=True``): data, labels[, sizes]."""
        records = self.records(self.base_epoch + info.epoch_idx, info.iteration)
        sizes = self.target_sizes(records)
        labels = np.array([r.label for r in records], dtype=np.int64)
        if self.encoding in PIXEL_ENCODINGS:
            from readers.decode import decode_array

            data = [decode_array(r) for r in records]
        else:
            data = [np.frombuffer(r.data, dtype=np.uint8) for r in records]
        return (data, labels, sizes)[: self.num_outputs]

    # -- pickling (parallel external_source workers, DataLoader workers) -----------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_positions"] = None
        return state
