"""BMP decoding with NumPy, and the encoder imgpack's BMP cache uses.

The decoder handles what the cache and most tools write: uncompressed 24- and 32-bit BGR(X)
(BI_RGB, or BI_BITFIELDS with the standard masks) and 8-bit palettes, bottom-up or top-down
rows, with row padding. Grey palettes come back as one channel, colour palettes as RGB.
Anything else (RLE, 1/4/16-bit, OS/2 headers, odd masks) falls back to Pillow.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np

try:
    import cv2
except ImportError:  # optional (imgpack[cv]); NumPy does the channel swap without it
    cv2 = None  # type: ignore[assignment]

FILE_HEADER = 14
INFO_HEADER = 40
BI_RGB, BI_BITFIELDS = 0, 3
STANDARD_MASKS = (0x00FF0000, 0x0000FF00, 0x000000FF)  # R, G, B in a little-endian 32-bit pixel
GREY = np.arange(256, dtype=np.uint8)


def _pillow(data: Any) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as img:
        grey = img.mode in ("1", "L", "I;16", "I") or (img.mode == "P" and _grey_palette(img))
        return np.asarray(img.convert("L" if grey else "RGB"))


def _grey_palette(img: Any) -> bool:
    palette = img.getpalette() or []
    return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette), 3))


def decode_bmp(data: Any) -> np.ndarray:
    """HWC uint8 pixels of a BMP file: (H, W, 1) for grey palettes, else (H, W, 3) RGB.

    The array is C-contiguous (the BGR to RGB swap is one copy), as torch.from_numpy needs.
    """
    view = memoryview(data).cast("B")
    if len(view) < FILE_HEADER + INFO_HEADER or bytes(view[:2]) != b"BM":
        return _pillow(data)
    offset, header_size = struct.unpack_from("<II", view, 10)
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", view, 18)
    colours_used = struct.unpack_from("<I", view, 46)[0]
    if header_size < INFO_HEADER or width <= 0 or height == 0:
        return _pillow(data)
    if compression == BI_BITFIELDS:
        masks_at = FILE_HEADER + INFO_HEADER  # after a 40-byte header, or inside a V4/V5 one
        if (
            bpp != 32
            or len(view) < masks_at + 12
            or struct.unpack_from("<III", view, masks_at) != STANDARD_MASKS
        ):
            return _pillow(data)
    elif compression != BI_RGB or bpp not in (8, 24, 32):
        return _pillow(data)
    top_down = height < 0
    height = abs(height)
    row_bytes = ((width * bpp + 31) // 32) * 4
    if offset + row_bytes * height > len(view):
        raise ValueError(
            f"truncated BMP: {width}x{height} at {bpp} bits needs {offset + row_bytes * height} bytes, "
            f"the file has {len(view)}"
        )
    rows = np.frombuffer(view, dtype=np.uint8, count=row_bytes * height, offset=offset)
    rows = rows.reshape(height, row_bytes)
    if not top_down:
        rows = rows[::-1]
    if bpp == 8:
        count = colours_used or 256
        start = FILE_HEADER + header_size
        if count > 256 or start + 4 * count > offset:
            return _pillow(data)
        palette = np.frombuffer(view, dtype=np.uint8, count=4 * count, offset=start).reshape(count, 4)
        indices = rows[:, :width]
        if count == 256 and np.array_equal(palette[:, 0], GREY) and (palette[:, :3] == GREY[:, None]).all():
            return np.ascontiguousarray(indices[:, :, None])  # identity grey palette: indices are pixels
        rgb = np.zeros((256, 3), dtype=np.uint8)
        rgb[:count] = palette[:, 2::-1]
        return rgb[indices]
    step = bpp // 8
    return _bgr_to_rgb(rows[:, : width * step].reshape(height, width, step))


def _bgr_to_rgb(bgr: np.ndarray) -> np.ndarray:
    """A new C-contiguous RGB array from BGR(X) pixels (OpenCV's SIMD swap when installed)."""
    if cv2 is not None:
        if bgr.strides[0] < 0:  # bottom-up rows: OpenCV wants positive steps
            bgr = np.ascontiguousarray(bgr)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB if bgr.shape[2] == 3 else cv2.COLOR_BGRA2RGB)
    rgb = np.empty((*bgr.shape[:2], 3), dtype=np.uint8)
    for channel in range(3):  # three plane copies beat one copy with a negative stride
        rgb[:, :, channel] = bgr[:, :, 2 - channel]
    return rgb


def encode_bmp(array: np.ndarray) -> bytes:
    """A BMP file for an HWC (or HW) uint8 array: 24-bit BGR, or 8-bit with a grey palette.

    Rows are stored top-down (negative height), so a reader copies them without flipping.
    """
    array = np.asarray(array, dtype=np.uint8)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"encode_bmp needs an HxW or HxWx1/3 uint8 array, got shape {array.shape}")
    height, width = array.shape[:2]
    gray = array.ndim == 2
    bpp = 8 if gray else 24
    row_bytes = ((width * bpp + 31) // 32) * 4
    palette = np.repeat(GREY, 4).reshape(256, 4) if gray else None
    if palette is not None:
        palette[:, 3] = 0
    offset = FILE_HEADER + INFO_HEADER + (palette.nbytes if palette is not None else 0)
    pixels = np.zeros((height, row_bytes), dtype=np.uint8)
    if gray:
        pixels[:, :width] = array
    else:
        pixels[:, : width * 3] = array[:, :, ::-1].reshape(height, width * 3)
    size = offset + pixels.nbytes
    header = struct.pack("<2sIHHI", b"BM", size, 0, 0, offset)
    info = struct.pack(
        "<IiiHHIIiiII", INFO_HEADER, width, -height, 1, bpp, BI_RGB, pixels.nbytes, 2835, 2835,
        256 if gray else 0, 0,
    )  # fmt: skip
    parts = [header, info]
    if palette is not None:
        parts.append(palette.tobytes())
    parts.append(pixels.tobytes())
    return b"".join(parts)
