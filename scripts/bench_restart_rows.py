#!/usr/bin/env python3
"""Would restart markers at every MCU row make training reads faster? (issue 24; the answer: no.)

The window decoder starts entropy decoding at the restart marker above a crop window when a JPEG
has one at each MCU row (csrc/restart_rows.c), instead of Huffman-decoding the rows it skips.
Packs could be written that way. This encodes ``--images`` files of a folder twice with OpenCV,
the same pixels (resized so the shorter side is ``--size``, or at their own size with
``--size 0``), without restart markers and with one per MCU row, and times on one core, in one
process, rounds rotating the order, median of ``--rounds``:

- the whole decode (simplejpeg, fast IDCT), as centre crops, verify and other readers do;
- the window decode of RandomResizedCrop(224) windows: the plain JPEGs (skipping rows), the
  marked JPEGs starting at the marker, and the marked JPEGs skipping rows.

    python scripts/bench_restart_rows.py --src /tmp/imgpack-bench/n2000 --images 400 --rounds 9
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import simplejpeg
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readers import RandomResizedCrop, jpegwindow  # noqa: E402
from readers.batch import BatchAssembler  # noqa: E402
from readers.geometry import Window  # noqa: E402
from readers.record import Record  # noqa: E402


def encode(bgr: np.ndarray, quality: int, interval: int) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_RST_INTERVAL, interval]
    params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]
    ok, data = cv2.imencode(".jpg", bgr, params)
    assert ok
    return data.tobytes()


def load(src: str, count: int, size: int) -> list[np.ndarray]:
    found = sorted(f for f in glob.glob(os.path.join(src, "**", "*"), recursive=True) if os.path.isfile(f))
    images = []
    for path in found[:count]:
        image = Image.open(path).convert("RGB")
        if size:
            scale = size / min(image.size)
            image = image.resize((round(image.width * scale), round(image.height * scale)))
        images.append(np.ascontiguousarray(np.asarray(image)[..., ::-1]))
    return images


def per_image_us(step, items) -> float:
    start = time.process_time()
    for item in items:
        step(item)
    return (time.process_time() - start) / len(items) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", required=True, help="a folder of images")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--size", type=int, default=256, help="shorter side; 0 keeps each image's size")
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if jpegwindow.DECODER is None:
        sys.exit("the window decoder is not available (readers._jpegwindow not built)")
    images = load(args.src, args.images, args.size)
    plain = [encode(image, args.quality, 0) for image in images]
    marked = [encode(image, args.quality, -(-image.shape[1] // 16)) for image in images]
    shapes = [image.shape[:2] for image in images]
    records = [Record(data, 0, h, w, 3, "jpeg") for data, (h, w) in zip(plain, shapes)]
    assembler = BatchAssembler(crop=RandomResizedCrop(224), fast_dct=True, seed=0)
    windows = [window for window, _ in assembler.params(records, np.arange(len(records)), 1)]
    scratch = np.empty(max(h * w for h, w in shapes) * 3, np.uint8)

    def windowed(data: list[bytes], from_marker: bool):
        def run() -> float:
            jpegwindow.FROM_RESTART_MARKERS = from_marker
            items = list(zip(data, shapes, windows))
            return per_image_us(
                lambda item: jpegwindow.decode_window(
                    item[0], item[1], Window(*item[2]), (224, 224), 3, scratch, True
                ),
                items,
            )

        return run

    def whole(data: list[bytes]):
        return lambda: per_image_us(lambda blob: simplejpeg.decode_jpeg(blob, fastdct=True), data)

    systems = {
        "whole decode, plain": whole(plain),
        "whole decode, restart rows": whole(marked),
        "window, plain (skip rows)": windowed(plain, True),
        "window, restart rows (from the marker)": windowed(marked, True),
        "window, restart rows (skip rows)": windowed(marked, False),
    }
    names = list(systems)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(systems[name]())
    jpegwindow.FROM_RESTART_MARKERS = True
    size = f"shorter side {args.size}" if args.size else "own size"
    print(f"{len(images)} images ({size}), JPEG q{args.quality} 4:2:0; bytes: plain "
          f"{np.mean([len(d) for d in plain]):,.0f}, restart rows {np.mean([len(d) for d in marked]):,.0f} "
          f"(+{100 * (sum(map(len, marked)) / sum(map(len, plain)) - 1):.2f}%)")  # fmt: skip
    print(f"CPU us per image, one core, median of {args.rounds} rounds:")
    for name, values in times.items():
        print(f"  {name:<40} {statistics.median(values):7.1f}   rounds {[round(v) for v in values]}")


if __name__ == "__main__":
    main()
