"""One record into its batch slot: copied, decoded (only its window, where it can), resized, mirrored.

``SlotWriter`` is the half of ``readers.batch.batch_assembler.BatchAssembler`` that handles one record; the
numbers (the placement of a stored size, the random window) come from the read's
``readers.image.geometry.Geometry``. Records go straight into the batch buffer:

- raw pixels: one copy per record (only the crop rows when cropping). A format that hands back a
  block as one contiguous array gains nothing more: 64 copies of 150 KB cost the same as one;
- JPEG: simplejpeg (libjpeg-turbo, releases the GIL) decodes into a per-thread scratch buffer that
  is reused (a fresh array per image costs page faults worth half a decode), or straight into the
  batch when no crop or resize is needed; the crop is copied from there. With ``resize`` and a stored
  image at least twice as large, libjpeg-turbo's DCT scaling decodes at 1/2, 1/4 or 1/8 scale;
- a JPEG (or an original file that is one) that is cropped decodes only the crop window's
  iMCU rows and columns (``readers.image.jpegwindow``: libjpeg-turbo's ``jpeg_skip_scanlines`` and
  ``jpeg_crop_scanline``), with the same DCT scaling; the same pixels as decoding it whole;
- anything else (PNG, BMP, JPEGs simplejpeg refuses) goes through ``readers.image.decode.decode_array``.

Exactness: raw, PNG and BMP records, and JPEGs without DCT scaling, give exactly the pixels of
``decode_array`` (then cropped / resized the same way). ``fast_dct=True`` (libjpeg-turbo's fast
integer IDCT, what FFCV uses) and DCT scaling are not bit-identical to a full decode: expect a mean
absolute difference below one grey level for ``fast_dct`` and of one to two for DCT scaling.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from readers.errors import ImgpackError
from readers.image import resample
from readers.image.decode import cv2, decode_array, simplejpeg, sniff
from readers.image.geometry import Geometry, Placement, Window, scaled_window
from readers.image.jpegwindow import decode_window
from readers.store.record import Record


class SlotWriter:
    """Writes one record into its (H, W, C) slot of a batch; see the module docstring."""

    read_geometry: Geometry
    fast_dct: bool
    dct_scaling: bool
    _local: threading.local

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
        geo = self.read_geometry.placement(record.height, record.width)
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
        """Decode only ``window`` of a JPEG record (readers.image.jpegwindow) and resize it into ``dst``;
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
    (``readers.image.resample``, the one CPU resampler)."""
    resample.resize(src, dst.shape[:2], out=dst)


def _resize(src: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return resample.resize(src, size)
