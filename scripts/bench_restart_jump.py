#!/usr/bin/env python3
"""What starting a JPEG's entropy decoding at the crop window's first rows would gain (issue 24).

The window decoder (``readers.jpegwindow``) skips the rows above a window with libjpeg-turbo's
``jpeg_skip_scanlines``, which still Huffman-decodes them: on 256 px and full-size photos entropy
decoding is most of a decode, so a window in the lower half costs almost a whole decode. A JPEG
written with a restart marker after every MCU row (Pillow: ``restart_marker_rows=1``, ~0.2% larger)
can instead be decoded from the restart interval just above the window: the headers with the
frame height reduced, then the entropy data after that marker (the DC predictors restart there),
the later markers renumbered from RST0. One MCU row more than needed is decoded and dropped, so
that chroma upsampling has its context and the pixels are those of the whole decode.

This probe re-encodes ``--images`` files of a folder that way and, per image:
- checks that the rows decoded from MCU rows 1, 1/3, 1/2 and 2/3 of the way down equal the whole
  decode's (the count of differing cases is printed; it must be 0);
- times, for the window "lower half, full width", the whole decode, ``decode_window`` (skipping
  scanlines) and the restart jump (building the stream included), fast IDCT, one core.

    python scripts/bench_restart_jump.py --src /tmp/imgpack-bench/n2000 --images 200
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readers.geometry import Window  # noqa: E402
from readers.jpegwindow import decode_window  # noqa: E402

RESTART = re.compile(rb"\xff[\xd0-\xd7]")
SOF_MARKERS = (0xC0, 0xC1)  # baseline and extended sequential: one scan, restart intervals apply


class Layout:
    """Where a sequential JPEG's frame header, scan data and restart markers are."""

    def __init__(self, data: bytes):
        i, self.sof = 2, -1
        while True:
            marker = data[i + 1]
            (length,) = struct.unpack(">H", data[i + 2 : i + 4])
            if marker in SOF_MARKERS:
                self.sof = i
                count = data[i + 9]
                factors = [data[i + 11 + 3 * c] & 0x0F for c in range(count)]
                self.mcu_height = 8 * max(factors)
            if marker == 0xDA:
                self.scan = i + 2 + length
                break
            i += 2 + length
        if self.sof < 0:
            raise ValueError("not a sequential JPEG")
        self.end = data.rindex(b"\xff\xd9")
        self.restarts = [m.start() for m in RESTART.finditer(data, self.scan, self.end)]


def from_mcu_row(data: bytes, layout: Layout, row: int) -> bytes:
    """The JPEG of ``data`` from MCU row ``row`` down (one restart marker per MCU row)."""
    if row == 0:
        return data
    head = bytearray(data[: layout.scan])
    (height,) = struct.unpack_from(">H", head, layout.sof + 5)
    struct.pack_into(">H", head, layout.sof + 5, height - layout.mcu_height * row)
    start = layout.restarts[row - 1] + 2
    body = bytearray(data[start : layout.end])
    for n, position in enumerate(layout.restarts[row:]):
        body[position - start + 1] = 0xD0 + n % 8
    return bytes(head) + bytes(body) + b"\xff\xd9"


def with_restart_markers(path: str, quality: int) -> bytes:
    out = io.BytesIO()
    Image.open(path).convert("RGB").save(out, "JPEG", quality=quality, restart_marker_rows=1)
    return out.getvalue()


def timed(step, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        step()
    return (time.perf_counter() - start) / repeat


def check_rows(data: bytes, layout: Layout, whole: np.ndarray) -> tuple[int, int]:
    """(windows checked, windows differing): decoded from MCU rows 1, 1/3, 1/2, 2/3 down."""
    rows, mcu = len(layout.restarts) + 1, layout.mcu_height
    starts = sorted({1, rows // 3, rows // 2, 2 * rows // 3} - {0})
    differing = 0
    for row in starts:
        part = simplejpeg.decode_jpeg(from_mcu_row(data, layout, row - 1), fastdct=True)
        differing += not np.array_equal(part[mcu:], whole[mcu * row :])
    return len(starts), differing


def time_lower_half(data: bytes, layout: Layout, whole: np.ndarray, repeat: int) -> dict[str, float]:
    """Seconds per decode of the window "lower half, full width", three ways."""
    height, width = whole.shape[:2]
    row = (len(layout.restarts) + 1) // 2
    top = layout.mcu_height * row
    window = Window(top, 0, height - top, width)
    scratch = np.empty(height * width * 3, dtype=np.uint8)
    return {
        "whole decode": timed(lambda: simplejpeg.decode_jpeg(data, fastdct=True), repeat),
        "decode_window (skip_scanlines)": timed(
            lambda: decode_window(
                data, (height, width), window, (height - top, width), 3, scratch, True, False
            ),
            repeat,
        ),
        "restart jump": timed(
            lambda: simplejpeg.decode_jpeg(from_mcu_row(data, layout, row - 1), fastdct=True), repeat
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", required=True, help="a folder of images (class folders of files)")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    found = glob.glob(os.path.join(args.src, "**", "*"), recursive=True)
    files = sorted(f for f in found if os.path.isfile(f))[: args.images]
    cases = differing = 0
    totals: dict[str, float] = {}
    for path in files:
        data = with_restart_markers(path, args.quality)
        layout = Layout(data)
        whole = simplejpeg.decode_jpeg(data, fastdct=True)
        checked, bad = check_rows(data, layout, whole)
        cases, differing = cases + checked, differing + bad
        for name, seconds in time_lower_half(data, layout, whole, args.repeat).items():
            totals[name] = totals.get(name, 0.0) + seconds
    print(f"{cases} windows decoded from a restart marker, {differing} differing from the whole decode")
    print("lower half, full width, one core, fast IDCT, us per image:")
    for name, seconds in totals.items():
        print(f"  {name:<32} {seconds / len(files) * 1e6:7.0f}")


if __name__ == "__main__":
    main()
