"""Assembling whole batches inside a worker: one buffer per batch, filled in place, sent once.

The buffer is HWC per image, ``(B, H, W, C)`` uint8; each record goes straight into its slot
(``readers.batch.batch_slot``: one copy of raw pixels, a JPEG decoded in place or only its crop
window's rows, DCT scaling; a whole batch of raw records at the batch's size is one copy each).

Geometry, applied per image, with the numbers of ``readers.image.geometry`` (the packer's and DALI's
too): ``resize`` (int: shorter side, the other rounded to nearest, ties to even; (h, w): exact)
resizes with ``readers.image.resample`` (the one CPU resampler, also the packer's), then ``crop`` takes
the centre
``crop`` x ``crop`` (or (h, w)) window, top-left at ``((H - h) // 2, (W - w) // 2)``. Without
``resize`` and ``crop`` the stored size is kept, and every image must have it.

Training: ``crop=RandomResizedCrop(...)`` takes a random window of the stored pixels per image and
resizes only that window straight into the batch slot (``resize_into``); ``flip`` mirrors in place
after. Windows and flips come from ``readers.image.geometry.Augment``: a function of (seed, epoch,
global sample index), so the callers pass each record's index. A JPEG whose window is at least
twice the output is decoded at 1/2, 1/4 or 1/8 scale and the window mapped onto that grid.

``layout="CHW"`` returns ``(B, C, H, W)`` as a permuted view of the HWC buffer: PyTorch's
``channels_last`` memory format, what convolutions on GPU prefer; ``.contiguous()`` makes it plain
NCHW. ``layout="HWC"`` returns ``(B, H, W, C)``, contiguous.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.ma  # noqa: F401 - numpy imports these two on first use (np.unique, the epoch order):
import numpy.random  # noqa: F401 - once here, not in every DataLoader worker's first batch
import torch
from torch.utils.data import get_worker_info

from readers.batch.batch_slot import SlotWriter, _mirror, _resize, resize_into
from readers.batch.shmring import worker_ring
from readers.errors import ImgpackError
from readers.fields.boxes import SampleGeometry
from readers.fields.targets import received
from readers.image.geometry import NO_PARAMS, Geometry, Params, Placement, RandomResizedCrop
from readers.process import ProcessPool
from readers.spec import ReadSpec
from readers.store.record import Record

Size = int | tuple[int, int] | None
Crop = int | tuple[int, int] | RandomResizedCrop | None


class BatchAssembler(SlotWriter):
    """Turns a list of records into one ``(images, labels)`` batch; see the module docstring."""

    def __init__(
        self,
        layout: str = "CHW",
        crop: Crop = None,
        resize: Size = None,
        decode_threads: int = 0,
        fast_dct: bool = False,
        dct_scaling: bool = True,
        flip: bool | float | None = None,
        seed: int = 0,
        *,
        geometry: Geometry | None = None,
    ):
        # The reading paths pass the read's one geometry (ReadSpec.geometry); built by hand (tests,
        # benchmarks) the options get the spec's checks, and each stored size its fit check.
        if geometry is None:
            geometry = ReadSpec(crop=crop, resize=resize, flip=flip or False, seed=seed).geometry()
        self.read_geometry = geometry
        self.augment = geometry.augment
        self.layout = layout
        self.decode_threads = int(decode_threads)
        self.fast_dct = bool(fast_dct)
        self.dct_scaling = bool(dct_scaling)
        self._pool = ProcessPool(self.decode_threads, "imgpack-decode")
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_local"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    # -- geometry -----------------------------------------------------------------------------
    def geometry(self, height: int, width: int) -> Placement:
        """Where an image stored at height x width lands in the batch (``Geometry.placement``)."""
        return self.read_geometry.placement(height, width)

    # -- assembly -----------------------------------------------------------------------------
    def output_shape(self, records: Sequence[Record]) -> tuple[int, int, int]:
        first = records[0]
        channels = first.channels or 3
        out = None
        for record in records:
            geo = self.geometry(record.height, record.width).out
            if out is None:
                out = geo
            elif geo != out:
                raise ImgpackError(
                    f"a batch needs images of one size but got {out[0]}x{out[1]} and {geo[0]}x{geo[1]}; "
                    "pass crop= (and resize=) to open_iterable, or pack with --crop N"
                )
            if (record.channels or 3) != channels:
                raise ImgpackError("a batch needs images with one channel count; pack with --mode RGB")
        assert out is not None
        return out[0], out[1], channels

    def params(
        self, records: Sequence[Record], indices: Sequence[int] | np.ndarray | None, epoch: int
    ) -> list[Params]:
        """Each record's (window, flip): random when augmenting, from its global sample index."""
        return self.read_geometry.params(epoch, indices, [(r.height, r.width) for r in records])

    def sample_geometries(self, records: Sequence[Record], params: Sequence[Params]) -> list[SampleGeometry]:
        """The geometry each record's image goes through (``Geometry.sample_geometries``)."""
        return self.read_geometry.sample_geometries([(r.height, r.width) for r in records], params)

    def fill(self, records: Sequence[Record], out: np.ndarray, params: Sequence[Params] | None = None):
        """Decode or copy ``records`` into ``out`` (B, H, W, C) uint8, in place."""
        if params is None and self._copy_raw(records, out):
            return
        params = params or [NO_PARAMS] * len(records)
        if self.decode_threads <= 1 or len(records) < 2:
            for i, record in enumerate(records):
                self._put(record, out[i], *params[i])
            return
        pool = self._pool.get()  # this process's own (a forked worker has none of the parent's threads)
        step = -(-len(records) // self.decode_threads)

        def run(start: int) -> None:
            for i in range(start, min(start + step, len(records))):
                self._put(records[i], out[i], *params[i])

        for future in [pool.submit(run, s) for s in range(0, len(records), step)]:
            future.result()

    def _copy_raw(self, records: Sequence[Record], out: np.ndarray) -> bool:
        """Raw records stored at the batch's size, nothing to crop, resize or flip: one memcpy
        each into the batch (per-record NumPy views cost twice the copy); False otherwise."""
        h, w, c = out.shape[1:]
        size = h * w * c
        geo = self.geometry(h, w)
        if self.augment.active or geo.out != (h, w) or geo.resized != (h, w) or not out.flags.c_contiguous:
            return False
        for r in records:
            if (
                r.encoding != "raw"
                or r.height != h
                or r.width != w
                or (r.channels or 3) != c
                or len(r.data) != size
            ):
                return False
        flat = out.data.cast("B")
        for i, r in enumerate(records):
            flat[i * size : (i + 1) * size] = r.data
        return True

    def __call__(
        self,
        records: Sequence[Record],
        out: np.ndarray | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
        epoch: int = 0,
        params: Sequence[Params] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` for ``records`` (global sample ``indices``, needed when augmenting),
        decoded into ``out`` (allocated when None); ``params``: ``params()`` when already drawn."""
        if not records:
            raise ValueError("cannot assemble an empty batch")
        shape = (len(records), *self.output_shape(records))
        if out is None:
            out = np.empty(shape, dtype=np.uint8)
        if params is None and self.augment.active:
            params = self.params(records, indices, epoch)
        self.fill(records, out, params)
        labels = torch.tensor([r.label for r in records], dtype=torch.int64)
        return self.present(torch.from_numpy(out)), labels

    def one(self, record: Record, index: int, epoch: int) -> np.ndarray:
        """One record as an HWC uint8 array, cropped, resized and flipped like a batch member."""
        out = np.empty((1, *self.output_shape([record])), dtype=np.uint8)
        self.fill([record], out, self.params([record], [index], epoch))
        return out[0]

    def shared(
        self,
        records: Sequence[Record],
        indices: Sequence[int] | np.ndarray | None = None,
        epoch: int = 0,
        fields: dict[str, Any] | None = None,
        params: Sequence[Params] | None = None,
    ) -> Any:
        """What a DataLoader worker yields for ``records``: the batch in a shared ring slot.

        In a worker this is a ``readers.batch.shmring.Lease`` that unpickles to ``(images, labels)`` in
        the main process without copying pixels; in the main process it is ``(images, labels)``.
        With ``fields`` (collated, readers/fields/sample_fields.py) the second item is the dict
        ``{"label": labels, **fields}``; the fields travel in the same message as the lease.
        ``params``: ``params()`` when the caller drew them already (for the fields' boxes).
        """
        # In a worker the ring comes first: it settles a fresh worker's garbage collector (see there)
        ring = worker_ring() if get_worker_info() is not None else None
        if params is None and self.augment.active:
            params = self.params(records, indices, epoch)
        if ring is None:
            images, label_tensor = self(records, indices=indices, epoch=epoch, params=params)
            return received(images, label_tensor, fields)
        shape = (len(records), *self.output_shape(records))
        nbytes = int(np.prod(shape))
        slot = ring.acquire(nbytes)
        if slot is None:  # the consumer holds every slot: a one-off buffer, shared on pickling
            images, label_tensor = self(records, indices=indices, epoch=epoch, params=params)
            return received(images, label_tensor, fields)
        try:
            hwc = ring.slots[slot][:nbytes].view(shape)
            self.fill(records, hwc.numpy(), params)
        except BaseException:
            ring.release(slot)
            raise
        labels = np.fromiter((r.label for r in records), dtype=np.int64, count=len(records))
        return ring.lease(slot, self.present(hwc), labels, fields)

    def present(self, hwc: torch.Tensor) -> torch.Tensor:
        """The batch as returned to the user, from the (B, H, W, C) buffer."""
        return hwc.permute(0, 3, 1, 2) if self.layout == "CHW" else hwc


__all__ = ["BatchAssembler", "Crop", "Size", "_mirror", "_resize", "resize_into"]
