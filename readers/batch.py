"""Assembling whole batches inside a worker: one buffer per batch, filled in place, sent once.

The buffer is HWC per image, ``(B, H, W, C)`` uint8; records go straight into it:

- raw pixels: one copy per record (only the crop rows when cropping). A format that hands back a
  block as one contiguous array gains nothing more: 64 copies of 150 KB cost the same as one;
- JPEG: simplejpeg (libjpeg-turbo, releases the GIL) decodes into a per-thread scratch buffer that
  is reused (a fresh array per image costs page faults worth half a decode), or straight into the
  batch when no crop or resize is needed; the crop is copied from there. With ``size`` and a stored
  image at least twice as large, libjpeg-turbo's DCT scaling decodes at 1/2, 1/4 or 1/8 scale;
- anything else (PNG, BMP, JPEGs simplejpeg refuses) goes through ``readers.decode.decode_array``.

Geometry, applied per image: ``size`` (int: shorter side, the other rounded like the packer;
(h, w): exact) resizes with OpenCV's area filter (bilinear when enlarging), then ``crop`` takes the
centre ``crop`` x ``crop`` (or (h, w)) window, top-left at ``((H - h) // 2, (W - w) // 2)`` like the
packer. Without ``size`` and ``crop`` the stored size is kept, and every image must have it.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from readers.decode import cv2, decode_array, simplejpeg
from readers.errors import ImgpackError
from readers.record import Record
from readers.shmring import worker_ring

Size = int | tuple[int, int] | None


def _pair(value: Size, name: str) -> tuple[int, int] | None:
    if value is None:
        return None
    pair = (value, value) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{name}={value!r}; use a positive int or (height, width)")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class Geometry:
    """Where an image of a given stored size ends up in the batch."""

    resized: tuple[int, int]  # (h, w) after ``size``
    top: int
    left: int
    out: tuple[int, int]  # (h, w) written into the batch


class BatchAssembler:
    """Turns a list of records into one ``(images, labels)`` batch; see the module docstring."""

    def __init__(
        self,
        layout: str = "CHW",
        crop: Size = None,
        size: Size = None,
        decode_threads: int = 0,
        fast_dct: bool = False,
        dct_scaling: bool = True,
    ):
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"layout={layout!r}; use 'CHW' or 'HWC'")
        if decode_threads < 0:
            raise ValueError(f"decode_threads={decode_threads} must be 0 (decode in the worker) or more")
        self.layout = layout
        self.crop = _pair(crop, "crop")
        self.size = size if isinstance(size, int) or size is None else _pair(size, "size")
        if isinstance(self.size, int) and self.size < 1:
            raise ValueError(f"size={size!r}; use a positive int or (height, width)")
        self.decode_threads = int(decode_threads)
        self.fast_dct = bool(fast_dct)
        self.dct_scaling = bool(dct_scaling)
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._geometries: dict[tuple[int, int], Geometry] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_local"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    # -- geometry -----------------------------------------------------------------------------
    def geometry(self, height: int, width: int) -> Geometry:
        """Where an image stored at height x width lands in the batch (memoised: batches repeat sizes)."""
        geo = self._geometries.get((height, width))
        if geo is None:
            geo = self._geometries[(height, width)] = self._compute_geometry(height, width)
        return geo

    def _compute_geometry(self, height: int, width: int) -> Geometry:
        if self.size is None:
            resized = (height, width)
        elif isinstance(self.size, int):
            scale = self.size / min(height, width)
            resized = (max(1, round(height * scale)), max(1, round(width * scale)))
        else:
            resized = self.size
        if self.crop is None:
            return Geometry(resized, 0, 0, resized)
        ch, cw = self.crop
        if ch > resized[0] or cw > resized[1]:
            raise ImgpackError(
                f"crop {ch}x{cw} is larger than an image of {resized[0]}x{resized[1]} (stored "
                f"{height}x{width}); pass size= to resize first, or a smaller crop"
            )
        return Geometry(resized, (resized[0] - ch) // 2, (resized[1] - cw) // 2, (ch, cw))

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
                    "pass crop= (and size=) to open_iterable, or pack with --crop N"
                )
            if (record.channels or 3) != channels:
                raise ImgpackError("a batch needs images with one channel count; pack with --mode RGB")
        assert out is not None
        return out[0], out[1], channels

    def fill(self, records: Sequence[Record], out: np.ndarray) -> None:
        """Decode or copy ``records`` into ``out`` (B, H, W, C) uint8, in place."""
        if self.decode_threads <= 1 or len(records) < 2:
            for i, record in enumerate(records):
                self._put(record, out[i])
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="imgpack-decode")
        step = -(-len(records) // self.decode_threads)

        def run(start: int) -> None:
            for i in range(start, min(start + step, len(records))):
                self._put(records[i], out[i])

        for future in [self._pool.submit(run, s) for s in range(0, len(records), step)]:
            future.result()

    def __call__(
        self, records: Sequence[Record], out: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` for ``records``, decoded into ``out`` (allocated when None)."""
        if not records:
            raise ValueError("cannot assemble an empty batch")
        shape = (len(records), *self.output_shape(records))
        if out is None:
            out = np.empty(shape, dtype=np.uint8)
        self.fill(records, out)
        labels = torch.tensor([r.label for r in records], dtype=torch.int64)
        return self.present(torch.from_numpy(out)), labels

    def shared(self, records: Sequence[Record]) -> Any:
        """What a DataLoader worker yields for ``records``: the batch in a shared ring slot.

        In a worker this is a ``readers.shmring.Lease`` that unpickles to ``(images, labels)`` in
        the main process without copying pixels; in the main process it is ``(images, labels)``.
        """
        if get_worker_info() is None:
            return self(records)
        shape = (len(records), *self.output_shape(records))
        ring = worker_ring()
        nbytes = int(np.prod(shape))
        slot = ring.acquire(nbytes)
        if slot is None:  # the consumer holds every slot: a one-off buffer, shared on pickling
            return self(records)
        try:
            hwc = ring.slots[slot][:nbytes].view(shape)
            self.fill(records, hwc.numpy())
        except BaseException:
            ring.release(slot)
            raise
        labels = np.fromiter((r.label for r in records), dtype=np.int64, count=len(records))
        return ring.lease(slot, self.present(hwc), labels)

    def present(self, hwc: torch.Tensor) -> torch.Tensor:
        """The batch as returned to the user, from the (B, H, W, C) buffer."""
        return hwc.permute(0, 3, 1, 2) if self.layout == "CHW" else hwc

    # -- one record ---------------------------------------------------------------------------
    def _scratch(self, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < nbytes:
            buf = self._local.buf = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
        return buf

    def _put(self, record: Record, dst: np.ndarray) -> None:
        geo = self.geometry(record.height, record.width)
        channels = dst.shape[2]
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

    def _jpeg(self, record: Record, geo: Geometry, dst: np.ndarray) -> np.ndarray | None:
        colorspace = "GRAY" if dst.shape[2] == 1 else "RGB"
        height, width = record.height, record.width
        kwargs: dict[str, Any] = {"colorspace": colorspace, "fastdct": self.fast_dct}
        scaled = (
            self.dct_scaling
            and self.size is not None
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

    def _place(self, src: np.ndarray, geo: Geometry, dst: np.ndarray) -> None:
        if src.ndim == 2:
            src = src[:, :, None]
        if src.shape[2] != dst.shape[2]:
            raise ImgpackError(
                f"an image has {src.shape[2]} channels where the batch has {dst.shape[2]}; "
                "pack with --mode RGB"
            )
        if src.shape[:2] != geo.resized:
            src = _resize(src, geo.resized)
        oh, ow = geo.out
        dst[...] = src[geo.top : geo.top + oh, geo.left : geo.left + ow]


def _resize(src: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    h, w = size
    shrinking = h * w < src.shape[0] * src.shape[1]
    if cv2 is None:
        from PIL import Image

        img = Image.fromarray(src[:, :, 0] if src.shape[2] == 1 else src)
        out = np.asarray(img.resize((w, h), Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR))
    else:
        interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
        out = cv2.resize(np.ascontiguousarray(src), (w, h), interpolation=interpolation)
    return out.reshape(h, w, src.shape[2])


def assemble_batch(
    records: Sequence[Record], layout: str = "CHW", **options: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``records`` into one uint8 batch and int64 labels (see ``BatchAssembler``)."""
    return BatchAssembler(layout, **options)(records)
