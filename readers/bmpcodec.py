"""Minimal BMP decoding with NumPy (24/32-bit BI_RGB and 8-bit grayscale palettes).

Unusual BMPs (compressed, 16-bit, other palettes) fall back to Pillow.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np


def _pillow(data: Any) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as img:
        return np.asarray(img.convert("RGB"))


def decode_bmp(data: Any) -> np.ndarray:
    view = memoryview(data)
    if len(view) < 54 or bytes(view[:2]) != b"BM":
        return _pillow(data)
    offset = struct.unpack_from("<I", view, 10)[0]
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", view, 18)
    top_down = height < 0
    height = abs(height)
    if compression != 0 or bpp not in (8, 24, 32):
        return _pillow(data)
    row_bytes = ((width * bpp + 31) // 32) * 4
    rows = np.frombuffer(view, dtype=np.uint8, count=row_bytes * height, offset=offset)
    rows = rows.reshape(height, row_bytes)
    if not top_down:
        rows = rows[::-1]
    if bpp == 8:
        return rows[:, :width][:, :, None]  # written by imgpack only for grayscale palettes
    step = bpp // 8
    return rows[:, : width * step].reshape(height, width, step)[:, :, 2::-1]


def encode_bmp(array: np.ndarray) -> bytes:
    """A BMP file for an HWC (or HW) uint8 array: 24-bit BGR, or 8-bit with a grey palette.

    Rows are stored top-down (negative height), so a reader copies them without flipping.
    """
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    height, width = array.shape[:2]
    gray = array.ndim == 2
    bpp = 8 if gray else 24
    row_bytes = ((width * bpp + 31) // 32) * 4
    palette = np.repeat(np.arange(256, dtype=np.uint8), 4).reshape(256, 4) if gray else None
    if palette is not None:
        palette[:, 3] = 0
    offset = 14 + 40 + (palette.nbytes if palette is not None else 0)
    pixels = np.zeros((height, row_bytes), dtype=np.uint8)
    if gray:
        pixels[:, :width] = array
    else:
        pixels[:, : width * 3] = array[:, :, ::-1].reshape(height, width * 3)
    size = offset + pixels.nbytes
    header = struct.pack("<2sIHHI", b"BM", size, 0, 0, offset)
    info = struct.pack(
        "<IiiHHIIiiII", 40, width, -height, 1, bpp, 0, pixels.nbytes, 2835, 2835, 256 if gray else 0, 0
    )
    parts = [header, info]
    if palette is not None:
        parts.append(palette.tobytes())
    parts.append(pixels.tobytes())
    return b"".join(parts)
