"""JPEG encoding for packs: 4:2:0 at the pack's quality, with a restart marker after every MCU row.

The markers are what lets a random crop skip the rows above its window entirely: the readers'
window decoder (``readers.jpegwindow``) starts entropy decoding at the marker just above the
window instead of Huffman-decoding every row it skips (csrc/restart_rows.c). They cost two bytes
and up to seven bits of padding per MCU row (+0.4% on a 256 px JPEG at quality 90) and change no
pixel: any JPEG decoder reads them (libjpeg, DALI, TensorFlow, browsers).

OpenCV encodes (its libjpeg-turbo, as fast as simplejpeg here, which cannot write markers;
Pillow can, at ~1.35x the time per image). Its restart interval counts MCUs, so one MCU row is
``ceil(width / 16)`` MCUs in colour (16x16 MCUs at 4:2:0) and ``ceil(width / 8)`` in grey.
"""

from __future__ import annotations

import cv2
import numpy as np


def restart_interval(width: int, grey: bool) -> int:
    """MCUs per MCU row of a ``width`` px wide JPEG: a restart marker at the start of every row."""
    mcu = 8 if grey else 16
    return -(-width // mcu)


def encode_jpeg(array: np.ndarray, quality: int) -> bytes:
    """``array`` (HxW grey or HxWx3 RGB, uint8) as a baseline JPEG with restart rows."""
    grey = array.ndim == 2
    pixels = array if grey else cv2.cvtColor(array, cv2.COLOR_RGB2BGR)
    params = [
        cv2.IMWRITE_JPEG_QUALITY, quality,
        cv2.IMWRITE_JPEG_RST_INTERVAL, restart_interval(array.shape[1], grey),
        cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    ]  # fmt: skip
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(pixels), params)
    if not ok:  # pragma: no cover - OpenCV raises for every input it cannot encode
        raise ValueError(f"OpenCV could not encode a {array.shape} image as JPEG")
    return encoded.tobytes()
