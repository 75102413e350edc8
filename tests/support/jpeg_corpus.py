"""JPEGs for the window decoder's safety checks: generated files of every kind the decoder meets,
and deterministic mutants of them (truncations, bit flips, bad markers, odd sampling factors).

Used by the sanitizer replay (tests/readers/image/test_decoder_sanitized.py), the coverage-guided run
(tests/support/fuzz_jpegwindow.py, whose seeds these are) and the differential check
(tests/support/jpeg_differential.py). Every function here is a pure function of its arguments: the same
corpus on every run, so a failure reproduces from its name.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import cv2
import numpy as np
from PIL import Image

from tests.support.jpeg import textured_pixels

SIZES = [(1, 1), (7, 13), (16, 16), (33, 17), (64, 48), (100, 131), (190, 257)]
# Pillow's options for each kind.
PILLOW_KINDS: dict[str, dict] = {
    "420": {},
    "422": {"subsampling": 1},
    "444": {"subsampling": 0},
    "progressive": {"progressive": True},
    "progressive-444": {"progressive": True, "subsampling": 0},
    "restart-rows": {"restart_marker_rows": 1},
    "restart-rows-422": {"restart_marker_rows": 1, "subsampling": 1},
    "restart-blocks": {"restart_marker_blocks": 3},
    "optimized": {"optimize": True, "quality": 60},
}
# OpenCV writes the sampling factors Pillow cannot (4:1:1, 4:4:0) and restart intervals in MCUs.
_411 = [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411]
_440 = [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440]
CV2_KINDS: dict[str, list[int]] = {
    "411": _411,
    "440": _440,
    "440-restart": [*_440, cv2.IMWRITE_JPEG_RST_INTERVAL, 2],
    "411-progressive": [*_411, cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
}


def pillow_jpeg(pixels: np.ndarray, mode: str = "RGB", quality: int = 90, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "JPEG", quality=quality, **options)
    return buf.getvalue()


def markers(data: bytes, code: int) -> list[int]:
    """Offsets of the markers 0xFF code outside entropy-coded data's stuffed bytes (a byte scan:
    0xFF00 never matches, and SOS/SOF codes do not occur as fill)."""
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == code]


def first_scans(data: bytes, scans: int) -> bytes:
    """A progressive JPEG ending after its first ``scans`` scans, properly closed with EOI: libjpeg
    decodes it without a warning (the missing coefficients are estimated: block smoothing)."""
    starts = markers(data, 0xDA)
    return data[: starts[scans]] + b"\xff\xd9" if scans < len(starts) else data


def seeds() -> dict[str, bytes]:
    """About 150 valid JPEGs: every kind x a spread of sizes (1x1 to 190x257), grey and CMYK,
    progressive files cut after 1..n scans. Arithmetic-coded and 12-bit files come from
    tests/support/jpeg_variants.py (they need libjpeg's compressor)."""
    out: dict[str, bytes] = {}
    for s, (height, width) in enumerate(SIZES):
        pixels = textured_pixels(height, width, seed=s)
        for kind, options in PILLOW_KINDS.items():
            out[f"{kind}-{height}x{width}"] = pillow_jpeg(pixels, **options)
        for kind, params in CV2_KINDS.items():
            ok, encoded = cv2.imencode(".jpg", pixels[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85, *params])
            assert ok
            out[f"{kind}-{height}x{width}"] = encoded.tobytes()
        out[f"grey-{height}x{width}"] = pillow_jpeg(pixels, "L")
        out[f"grey-progressive-{height}x{width}"] = pillow_jpeg(pixels, "L", progressive=True)
        out[f"cmyk-{height}x{width}"] = pillow_jpeg(pixels, "CMYK")
    for height, width in SIZES[3:]:
        pixels = textured_pixels(height, width, seed=height)
        for kind in ("progressive", "progressive-444"):
            whole = pillow_jpeg(pixels, **PILLOW_KINDS[kind])
            for scans in range(1, len(markers(whole, 0xDA))):
                out[f"{kind}-{height}x{width}-{scans}-scans"] = first_scans(whole, scans)
        grey = pillow_jpeg(pixels, "L", progressive=True)
        for scans in range(1, len(markers(grey, 0xDA))):
            out[f"grey-progressive-{height}x{width}-{scans}-scans"] = first_scans(grey, scans)
    return out


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from the first SOFn header, found the way libjpeg finds markers (the
    decoders under test, simplejpeg and Pillow all read headers with it): bytes before a marker
    are skipped (libjpeg warns of "extraneous bytes"), as are FF fill bytes and FF 00, and a
    segment whose length field is below 2 ends after that field. None: no header, or a cut one."""
    i = 2
    while i + 1 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker == 0x00:
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        if marker == 0xDA or marker == 0xD9 or i + 4 > len(data):
            return None
        i += 2 + max(2, int.from_bytes(data[i + 2 : i + 4], "big"))
    return None


def _segments(data: bytes) -> list[tuple[int, int]]:
    """(offset, marker code) of each header segment before the first scan."""
    found, i = [], 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        found.append((i, data[i + 1]))
        if data[i + 1] == 0xDA:
            break
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return found


def mutate(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One damaged copy of ``data`` and the name of the damage."""
    b = bytearray(data)
    n = len(b)
    kind = int(rng.integers(9))
    if kind == 0:  # truncated anywhere, sometimes closed with an EOI
        cut = int(rng.integers(2, n))
        return "truncated", bytes(b[:cut]) + (b"\xff\xd9" if rng.integers(2) else b"")
    if kind == 1:  # a few bit flips anywhere
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(n))
            b[i] ^= 1 << int(rng.integers(8))
        return "bitflips", bytes(b)
    if kind == 2:  # a random marker (RSTn, SOI, EOI, DHT, SOS, APPn...) dropped into the data
        i = int(rng.integers(2, n))
        code = int(rng.choice([0xD0, 0xD3, 0xD7, 0xD8, 0xD9, 0xC4, 0xDA, 0xDD, 0xE1, 0xC0, 0xC2, 0xFF, 0x01]))
        return "bad-marker", bytes(b[:i]) + bytes([0xFF, code]) + bytes(b[i:])
    segments = _segments(data)
    sof = [i for i, code in segments if 0xC0 <= code <= 0xCF and code not in (0xC4, 0xC8, 0xCC)]
    if kind == 3 and sof:  # odd sampling factors (1..4 each way, or 0) for one component
        i = sof[0]
        components = b[i + 9]
        c = int(rng.integers(max(1, components)))
        at = i + 10 + 3 * c + 1
        if at < n:
            b[at] = int(rng.integers(0, 5)) << 4 | int(rng.integers(0, 5))
        return "sampling", bytes(b)
    if kind == 4 and sof:  # a frame of another size: 0, 1, bigger, the 16-bit maximum
        i = sof[0]
        field = i + 5 + 2 * int(rng.integers(2))
        value = int(rng.choice([0, 1, 2, 9, 255, 4097, 65500, 65535]))
        b[field : field + 2] = value.to_bytes(2, "big")
        return "frame-size", bytes(b)
    if kind == 5 and segments:  # a segment length off by a little or a lot
        i, _ = segments[int(rng.integers(len(segments)))]
        length = int.from_bytes(b[i + 2 : i + 4], "big")
        length = int(np.clip(length + rng.choice([-3, -1, 1, 2, 200, -length]), 0, 65535))
        b[i + 2 : i + 4] = length.to_bytes(2, "big")
        return "segment-length", bytes(b)
    if kind == 6:  # restart markers renumbered, swapped or dropped
        rst = [i for i in range(n - 1) if b[i] == 0xFF and 0xD0 <= b[i + 1] <= 0xD7]
        if rst:
            i = rst[int(rng.integers(len(rst)))]
            if rng.integers(2):
                b[i + 1] = 0xD0 + int(rng.integers(8))
            else:
                del b[i : i + 2]
            return "restart-marker", bytes(b)
    if kind == 7:  # a frame type changed: baseline <-> progressive <-> arithmetic <-> lossless
        if sof:
            b[sof[0] + 1] = int(rng.choice([0xC0, 0xC1, 0xC2, 0xC3, 0xC9, 0xCA, 0xCB]))
            return "frame-type", bytes(b)
    if kind == 8 and sof:  # component count, precision or table ids changed
        i = sof[0]
        field = int(rng.choice([i + 4, i + 9, i + 12, i + 15]))
        if field < n:
            b[field] = int(rng.choice([0, 1, 2, 3, 4, 5, 12, 16, 255]))
        return "frame-field", bytes(b)
    i = int(rng.integers(n))  # otherwise: a run of bytes overwritten with 0xFF or 0x00
    b[i : i + int(rng.integers(1, 16))] = bytes([int(rng.choice([0x00, 0xFF]))]) * 16
    return "overwritten", bytes(b[:n])


def mutants(corpus: dict[str, bytes], count: int, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """``count`` damaged files, each named after its seed file, its damage and its number."""
    rng = np.random.default_rng(seed)
    names = sorted(corpus)
    for k in range(count):
        name = names[int(rng.integers(len(names)))]
        damage, data = mutate(corpus[name], rng)
        yield f"{name}-{damage}-{k}", data


WindowParams = tuple[int, int, int, int, int, bool, bool]


def window_params(prefix: bytes, size: tuple[int, int] | None) -> WindowParams:
    """(top, left, height, width, eighths, gray, fast_dct) from 6 bytes, in
    the image's scaled coordinates: the fuzzer steers the window with them."""
    p = (prefix + bytes(6))[:6]
    eighths = (1, 2, 3, 4, 8, 8, 8, 5)[p[4] & 7]
    height, width = (min(v, 65500) for v in size or (64, 64))  # the extension's argument limit
    sh, sw = max(1, -(-height * eighths // 8)), max(1, -(-width * eighths // 8))
    h = 1 + p[2] * (sh - 1) // 255
    w = 1 + p[3] * (sw - 1) // 255
    rows = max(1, min(sh, 2**25 // (3 * sw)))  # whole-rows references of at most 32 MiB
    h = min(h, rows)
    top = p[0] * (rows - h) // 255
    left = p[1] * (sw - w) // 255
    return top, left, h, w, eighths, bool(p[5] & 1), bool(p[5] & 2)
