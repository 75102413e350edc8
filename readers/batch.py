"""Assembling whole batches inside a worker: one buffer per batch, filled in place, sent once.

The buffer is HWC per image, ``(B, H, W, C)`` uint8; records go straight into it:

- raw pixels: one copy per record (only the crop rows when cropping). A format that hands back a
  block as one contiguous array gains nothing more: 64 copies of 150 KB cost the same as one;
- JPEG: simplejpeg (libjpeg-turbo, releases the GIL) decodes into a per-thread scratch buffer that
  is reused (a fresh array per image costs page faults worth half a decode), or straight into the
  batch when no crop or resize is needed; the crop is copied from there. With ``resize`` and a stored
  image at least twice as large, libjpeg-turbo's DCT scaling decodes at 1/2, 1/4 or 1/8 scale;
- a JPEG (or an original file that is one) that is cropped decodes only the crop window's
  iMCU rows and columns (``readers.jpegwindow``: libjpeg-turbo's ``jpeg_skip_scanlines`` and
  ``jpeg_crop_scanline``), with the same DCT scaling; the same pixels as decoding it whole;
- anything else (PNG, BMP, JPEGs simplejpeg refuses) goes through ``readers.decode.decode_array``.

Geometry, applied per image, with the numbers of ``readers.geometry`` (the packer's and DALI's
too): ``resize`` (int: shorter side, the other rounded to nearest, ties to even; (h, w): exact)
resizes with ``readers.resample`` (the one CPU resampler, also the packer's), then ``crop`` takes the centre
``crop`` x ``crop`` (or (h, w)) window, top-left at ``((H - h) // 2, (W - w) // 2)``. Without
``resize`` and ``crop`` the stored size is kept, and every image must have it.

Training: ``crop=RandomResizedCrop(...)`` takes a random window of the stored pixels per image and
resizes only that window straight into the batch slot (``resize_into``); ``flip`` mirrors in place
after. Windows and flips come from ``readers.geometry.Augment``: a function of (seed, epoch,
global sample index), so the callers pass each record's index. A JPEG whose window is at least
twice the output is decoded at 1/2, 1/4 or 1/8 scale and the window mapped onto that grid.

Exactness: raw, PNG and BMP records, and JPEGs without DCT scaling, give exactly the pixels of
``decode_array`` (then cropped / resized the same way). ``fast_dct=True`` (libjpeg-turbo's fast
integer IDCT, what FFCV uses) and DCT scaling are not bit-identical to a full decode: expect a mean
absolute difference below one grey level for ``fast_dct`` and of one to two for DCT scaling.

``layout="CHW"`` returns ``(B, C, H, W)`` as a permuted view of the HWC buffer: PyTorch's
``channels_last`` memory format, what convolutions on GPU prefer; ``.contiguous()`` makes it plain
NCHW. ``layout="HWC"`` returns ``(B, H, W, C)``, contiguous.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.ma  # noqa: F401 - numpy imports these two on first use (np.unique, the epoch order):
import numpy.random  # noqa: F401 - once here, not in every DataLoader worker's first batch
import torch
from torch.utils.data import get_worker_info

from readers import resample
from readers.boxes import SampleGeometry
from readers.decode import cv2, decode_array, simplejpeg, sniff
from readers.errors import ImgpackError
from readers.geometry import NO_PARAMS, Geometry, Params, Placement, RandomResizedCrop, Window, scaled_window
from readers.jpegwindow import decode_window
from readers.record import Record
from readers.shmring import worker_ring
from readers.spec import ReadSpec
from readers.targets import received

Size = int | tuple[int, int] | None
Crop = int | tuple[int, int] | RandomResizedCrop | None


class BatchAssembler:
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
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
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
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="imgpack-decode")
        step = -(-len(records) // self.decode_threads)

        def run(start: int) -> None:
            for i in range(start, min(start + step, len(records))):
                self._put(records[i], out[i], *params[i])

        for future in [self._pool.submit(run, s) for s in range(0, len(records), step)]:
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

        In a worker this is a ``readers.shmring.Lease`` that unpickles to ``(images, labels)`` in
        the main process without copying pixels; in the main process it is ``(images, labels)``.
        With ``fields`` (collated, readers/sample_fields.py) the second item is the dict
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

    # -- one record ---------------------------------------------------------------------------
    def _scratch(self, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < nbytes:
            buf = self._local.buf = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
        return buf

    def _put(self, record: Record, dst: np.ndarray, window: Window | None, flip: bool) -> None:
        if window is not None:
            self._put_window(record, dst, window)
        else:
            self._put_centre(record, dst)
        if flip:
            _mirror(dst)

    def _put_centre(self, record: Record, dst: np.ndarray) -> None:
        geo = self.geometry(record.height, record.width)
        if geo.resized == (record.height, record.width) != geo.out:  # a centre crop of the stored pixels
            if self._put_jpeg_window(record, dst, Window(geo.top, geo.left, *geo.out)):
                return
        channels = dst.shape[2]
        src: np.ndarray | None
        if record.encoding == "raw":
            src = np.frombuffer(record.data, dtype=np.uint8).reshape(record.height, record.width, channels)
            if geo.out == geo.resized == src.shape[:2]:
                dst[...] = src  # the common raw case: one copy, nothing to check
                return
        elif record.encoding == "jpeg" and simplejpeg is not None:
            src = self._jpeg(record, geo, dst)
            if src is None:
                return  # decoded straight into dst
        else:
            src = decode_array(record)
        self._place(src, geo, dst)

    def _put_window(self, record: Record, dst: np.ndarray, window: Window) -> None:
        """Crop ``window`` (stored pixels) and resize it straight into ``dst``."""
        if self._put_jpeg_window(record, dst, window):
            return
        if record.encoding == "jpeg" and simplejpeg is not None:
            src = self._jpeg_for_window(record, window, dst)
        else:
            src = decode_array(record)  # raw: a zero-copy view of the stored pixels
        src = _check_channels(src, dst)
        stored = (record.height, record.width)
        if src.shape[:2] != stored:  # decoded at 1/2-1/8 scale (or the header disagrees): map the window
            scale = (src.shape[0] / stored[0], src.shape[1] / stored[1])
            window = scaled_window(window, scale, src.shape[:2])
        top, left, h, w = window
        resize_into(src[top : top + h, left : left + w], dst)

    def _put_jpeg_window(self, record: Record, dst: np.ndarray, window: Window) -> bool:
        """Decode only ``window`` of a JPEG record (readers.jpegwindow) and resize it into ``dst``;
        False for other records, or when the window decoder is missing or refuses this JPEG."""
        if record.encoding == "jpeg":
            fast_dct, dct_scaling = self.fast_dct, self.dct_scaling
        elif record.encoding == "original" and sniff(record.data) == "jpeg":
            fast_dct = dct_scaling = False  # as decode_array decodes originals: accurate, full size
        else:
            return False
        channels = dst.shape[2]
        scratch = self._scratch(window.height * record.width * channels)
        stored = (record.height, record.width)
        out = dst.shape[:2]
        region = decode_window(record.data, stored, window, out, channels, scratch, fast_dct, dct_scaling)
        if region is None:
            return False
        resize_into(region, dst)
        return True

    def _jpeg_for_window(self, record: Record, window: Window, dst: np.ndarray) -> np.ndarray:
        """The decoded JPEG, at 1/2, 1/4 or 1/8 size when the window stays at least as large as
        the output there (DCT scaling: only when the window is twice the output or more)."""
        height, width = record.height, record.width
        oh, ow = dst.shape[:2]
        kwargs: dict[str, Any] = {
            "colorspace": "GRAY" if dst.shape[2] == 1 else "RGB",
            "fastdct": self.fast_dct,
            "buffer": self._scratch(height * width * dst.shape[2]),
        }
        if self.dct_scaling and window.height >= 2 * oh and window.width >= 2 * ow:
            kwargs.update(
                min_height=-(-height * oh // window.height),
                min_width=-(-width * ow // window.width),
                min_factor=2,
            )
        try:
            return simplejpeg.decode_jpeg(record.data, **kwargs)
        except ValueError:
            return decode_array(record)  # CMYK, odd sampling...: the general decoders

    def _jpeg(self, record: Record, geo: Placement, dst: np.ndarray) -> np.ndarray | None:
        colorspace = "GRAY" if dst.shape[2] == 1 else "RGB"
        height, width = record.height, record.width
        kwargs: dict[str, Any] = {"colorspace": colorspace, "fastdct": self.fast_dct}
        scaled = (
            self.dct_scaling
            and self.read_geometry.resize is not None
            and height >= 2 * geo.resized[0]
            and width >= 2 * geo.resized[1]
        )
        try:
            if scaled:
                # Largest libjpeg-turbo scale (1/2, 1/4, 1/8) that still covers the resized size.
                return simplejpeg.decode_jpeg(
                    record.data,
                    buffer=self._scratch(height * width * dst.shape[2]),
                    min_height=geo.resized[0],
                    min_width=geo.resized[1],
                    min_factor=2,
                    **kwargs,
                )
            if (height, width) == geo.out == geo.resized and dst.flags.c_contiguous:
                simplejpeg.decode_jpeg(record.data, buffer=dst, **kwargs)
                return None
            buf = self._scratch(height * width * dst.shape[2])
            return simplejpeg.decode_jpeg(record.data, buffer=buf, **kwargs)
        except ValueError:
            return decode_array(record)  # CMYK, odd sampling...: the general decoders

    def _place(self, src: np.ndarray, geo: Placement, dst: np.ndarray) -> None:
        src = _check_channels(src, dst)
        if src.shape[:2] != geo.resized:
            src = _resize(src, geo.resized)
        oh, ow = geo.out
        dst[...] = src[geo.top : geo.top + oh, geo.left : geo.left + ow]


def _check_channels(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    if src.ndim == 2:
        src = src[:, :, None]
    if src.shape[2] != dst.shape[2]:
        raise ImgpackError(
            f"an image has {src.shape[2]} channels where the batch has {dst.shape[2]}; pack with --mode RGB"
        )
    return src


def _mirror(dst: np.ndarray) -> None:
    """Flip an HWC image left-right in place."""
    if cv2 is not None and dst.shape[2] in (1, 3, 4):
        cv2.flip(dst, 1, dst=dst)
    else:
        dst[...] = dst[:, ::-1].copy()


def resize_into(src: np.ndarray, dst: np.ndarray) -> None:
    """Resize HWC ``src`` (a window view is fine) to ``dst``'s size, writing into ``dst``
    (``readers.resample``, the one CPU resampler)."""
    resample.resize(src, dst.shape[:2], out=dst)


def _resize(src: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return resample.resize(src, size)
