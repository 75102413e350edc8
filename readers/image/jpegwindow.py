"""Decode only the crop window of a JPEG: the MCU rows and columns that cover it, nothing else.

A random crop keeps on average half of a stored image (``RandomResizedCrop(scale=(0.08, 1))``),
a small one a tenth; decoding the rest and throwing it away is most of a training read's work.
libjpeg-turbo's libjpeg API can skip it: ``jpeg_skip_scanlines`` skips the rows above the window
(no IDCT, no colour conversion; the rows below are never read) and ``jpeg_crop_scanline`` limits
every row to the iMCU columns that cover the window. Combined with DCT scaling (1/2, 3/8, 1/4 or
1/8 when the window stays at least as large as the output: the factors and rule simplejpeg uses)
this is what the batch path does for every ``RandomResizedCrop`` window.

Skipping rows still Huffman-decodes them (each block's DC coefficient is coded against the
previous block's). Starting at a restart marker above the window would avoid that, but only for
JPEGs with a marker at every MCU row, which imgpack's packs never contain (a restart interval
makes libjpeg-turbo 4-6% slower throughout, cancelling the gain: docs/decisions.md).

Where libjpeg-turbo comes from (a fresh machine needs nothing but pip): the small C extension
``readers._jpegwindow`` (csrc/jpegwindow.c, built by ``pip install`` with the vendored libjpeg
6.2 headers) links no library; it ``dlopen``s the first of (``library_candidates``):
``$IMGPACK_LIBJPEG`` when set (that file only), else the libjpeg-turbo that Pillow's wheel bundles
(``pillow.libs/libjpeg-*.so.62`` on Linux, ``PIL/.dylibs/libjpeg.62.dylib`` on macOS), then a
system ``libjpeg.so.62``. The library's ABI version and struct size are checked against the
headers when a decode starts, so a mismatch is a refusal, not a crash; a library that loads is then
checked to decode a small window exactly as simplejpeg does. ``IMGPACK_JPEG_WINDOW=0`` switches the
decoder off. Without the extension (no C compiler at install time) or without a usable library,
``DECODER`` is None and callers decode the whole image and crop, as before; ``STATUS`` says which
case it is (``pack doctor`` prints it).

Pixels: the same as a whole decode (at the same DCT scale) followed by the crop, bit for bit on
the JPEGs the tests make (odd sizes, 4:2:0/4:2:2/4:4:4, grey, progressive, restart markers,
windows on every edge), because libjpeg-turbo decodes the context rows and columns that fancy
upsampling needs. Any JPEG the library would only decode with a warning (truncated, corrupt),
cannot convert (CMYK, YCCK) or would need more than 1 GiB of decoder memory for is refused
(``decode_window`` returns None) and goes to the general decoders. Progressive JPEGs that end
after some scans are decoded in whole rows (block smoothing would make a cropped row's left edge
differ). docs/window-decoder.md describes the sanitizer replay and the fuzzing that check this.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from readers.image.decode import decode_array, sniff
from readers.image.geometry import Window, scaled_window
from readers.store.record import Record

try:
    from readers import _jpegwindow
except ImportError:  # built by `pip install -e .`; without a C compiler the install skips it
    _jpegwindow = None  # type: ignore[assignment]

# The libjpeg-turbo the extension dlopened (the sanitizer replay checks it tests the same one).
LIBRARY: str | None = None
MAX_DIMENSION = 65500  # libjpeg's JPEG_MAX_DIMENSION; the extension refuses larger arguments
EIGHTHS = (1, 2, 3, 4)  # DCT scales that at least halve the image (simplejpeg's min_factor=2)


def library_candidates() -> list[str]:
    """The libjpeg-turbo files the extension tries, in order (see the module docstring)."""
    explicit = os.environ.get("IMGPACK_LIBJPEG")
    if explicit:
        return [explicit]
    try:
        import PIL
    except ImportError:  # pragma: no cover - Pillow is a hard dependency
        return []
    here = os.path.dirname(PIL.__file__)
    bundled = []  # auditwheel names the folder after the distribution (Pillow.libs in older wheels)
    for libs in ("pillow.libs", "Pillow.libs"):
        bundled += glob.glob(os.path.join(here, os.pardir, libs, "libjpeg*.so*"))
    bundled += glob.glob(os.path.join(here, ".dylibs", "libjpeg*.dylib"))
    system = ctypes.util.find_library("jpeg")
    return [os.path.normpath(p) for p in sorted(bundled)] + ([system] if system else [])


def _load() -> tuple[Any, str]:
    """(the loaded decoder or None, a line saying what was loaded or why nothing was)."""
    global LIBRARY
    if _jpegwindow is None:
        return None, (
            "off: the C extension readers._jpegwindow is not built (no C compiler when imgpack was "
            "installed?); reinstall with `pip install -e .` where gcc or clang is available"
        )
    if os.environ.get("IMGPACK_JPEG_WINDOW") == "0":
        return None, "off: IMGPACK_JPEG_WINDOW=0"
    tried = []
    for path in library_candidates():
        try:
            _jpegwindow.load(path)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue  # not libjpeg-turbo, or too old: try the next one
        if not _decodes_like_simplejpeg(_jpegwindow):
            return None, f"off: {path} loads but decodes a test window differently from simplejpeg"
        LIBRARY = path
        return _jpegwindow, f"on: {path}"
    if not tried:
        return None, "off: no libjpeg-turbo found (Pillow's, a system libjpeg, or $IMGPACK_LIBJPEG)"
    return None, "off: no usable libjpeg-turbo; tried " + "; ".join(tried)


def _decodes_like_simplejpeg(decoder: Any) -> bool:
    """One small window decoded at load time: a library whose ABI or build does not match the
    headers (refused) or decodes differently (other pixels) is not used at all."""
    try:
        import simplejpeg
    except ImportError:  # pragma: no cover - simplejpeg is a hard dependency
        return False
    y, x = np.mgrid[0:24, 0:40]
    image = np.stack([x * 6, y * 10, (x + y) * 4], -1).astype(np.uint8)
    data = simplejpeg.encode_jpeg(image, quality=90)
    out = np.empty(24 * 40 * 3, np.uint8)
    result = decoder.decode(data, out, 8, 16, 8, 16, 8, False, False)
    if result is None:
        return False
    row_width, skip = result[0], result[1]
    region = out[: 8 * row_width * 3].reshape(8, row_width, 3)[:, skip : skip + 16]
    return bool(np.array_equal(region, simplejpeg.decode_jpeg(data)[8:16, 16:32]))


DECODER, STATUS = _load()


def dct_eighths(height: int, width: int, min_height: int, min_width: int) -> int:
    """The DCT scale (in eighths) for an image of height x width that must stay at least
    min_height x min_width: the smallest of 1/8, 2/8, 3/8, 4/8 that does, else 8 (no scaling)."""
    for eighths in EIGHTHS:
        if -(-height * eighths // 8) >= min_height and -(-width * eighths // 8) >= min_width:
            return eighths
    return 8


def decode_window(
    data: Any,
    stored: tuple[int, int],
    window: Window,
    out: tuple[int, int],
    channels: int,
    scratch: np.ndarray,
    fast_dct: bool = False,
    dct_scaling: bool = True,
) -> np.ndarray | None:
    """The pixels of ``window`` (stored coordinates) of the JPEG ``data`` stored at ``stored``
    (height, width), as an HWC view into ``scratch``, DCT-scaled when the window is at least
    twice ``out`` (then mapped onto the scaled grid, as a scaled whole decode would be cropped).

    None when the window decoder is missing or refuses this JPEG: decode it whole instead.
    ``scratch`` must hold ``window.height * stored width * channels`` bytes.
    """
    if DECODER is None or channels not in (1, 3):
        return None
    height, width = stored
    eighths = 8
    if dct_scaling and window.height >= 2 * out[0] and window.width >= 2 * out[1]:
        min_height, min_width = -(-height * out[0] // window.height), -(-width * out[1] // window.width)
        eighths = dct_eighths(height, width, min_height, min_width)
    if eighths != 8:
        shape = (-(-height * eighths // 8), -(-width * eighths // 8))
        window = scaled_window(window, (shape[0] / height, shape[1] / width), shape)
    top, left, h, w = window
    if max(top + h, left + w) > MAX_DIMENSION:
        return None  # no JPEG libjpeg decodes is that large: the general decoders say what is wrong
    result = DECODER.decode(
        data, scratch, top, left, h, w, eighths, channels == 1, fast_dct)
    if result is None:
        return None
    row_width, skip, image_height, image_width = result[:4]
    if (image_height, image_width) != stored:
        return None  # the record's size disagrees with the JPEG header: let the general path decide
    rows = scratch[: h * row_width * channels].reshape(h, row_width, channels)
    return rows[:, skip : skip + w]


def decode_windows(records: Sequence[Record], windows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Each record decoded as ``decode_array`` would, but only its ``windows[i]`` (stored pixels,
    (top, left, height, width)) when it is a JPEG the window decoder takes: the arrays, and each
    window in its array's coordinates (0, 0, h, w where only the window was decoded).

    Full size and the accurate IDCT, so the pixels are those of the whole decode's crop.
    """
    arrays, inside = [], windows.copy()
    for i, (record, window) in enumerate(zip(records, windows.tolist())):
        region = None
        channels = record.channels or 3
        if record.encoding == "jpeg" or record.encoding == "original" and sniff(record.data) == "jpeg":
            scratch = np.empty(window[2] * record.width * channels, np.uint8)
            stored = (record.height, record.width)
            region = decode_window(
                record.data, stored, Window(*window), window[2:], channels, scratch, False, False
            )
        if region is None:
            arrays.append(decode_array(record))
        else:
            arrays.append(region)
            inside[i, :2] = 0
    return arrays, inside
