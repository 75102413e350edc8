"""Pillow against OpenCV as the one CPU resampler: the resizes the batch path does, timed per image.

    python scripts/bench_resampler.py [--rounds 5]

Cases: the centre path (a 500x375 decode resized to shorter side 256) and RandomResizedCrop windows
(random windows of a 500x375 image resized to 224x224, from readers.geometry with a fixed seed).
Each resampler runs on the same inputs into a preallocated HWC uint8 batch slot, rounds alternate
the order, and the median of the rounds is printed in ms per image.
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np
from PIL import Image

from readers.geometry import RandomResizedCrop, resized_size, sample_uniforms


def pillow(src: np.ndarray, dst: np.ndarray) -> None:
    h, w = dst.shape[:2]
    dst[...] = np.asarray(Image.fromarray(src).resize((w, h), Image.Resampling.BILINEAR))


def opencv(src: np.ndarray, dst: np.ndarray) -> None:
    h, w = dst.shape[:2]
    far = src.shape[0] >= 2 * h and src.shape[1] >= 2 * w
    cv2.resize(src, (w, h), dst=dst, interpolation=cv2.INTER_AREA if far else cv2.INTER_LINEAR)


def opencv_area(src: np.ndarray, dst: np.ndarray) -> None:
    h, w = dst.shape[:2]
    cv2.resize(src, (w, h), dst=dst, interpolation=cv2.INTER_AREA)


def cases(n: int) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(0)
    image = cv2.GaussianBlur(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8), (5, 5), 0)
    centre = resized_size(375, 500, 256)
    crop = RandomResizedCrop(224)
    windows = [crop.window(375, 500, row[1:]) for row in sample_uniforms(0, 0, np.arange(n)).tolist()]
    return {
        "centre 500x375 -> shorter 256": [(image, np.empty((*centre, 3), np.uint8)) for _ in range(n)],
        "RandomResizedCrop -> 224": [
            (image[w.top : w.top + w.height, w.left : w.left + w.width], np.empty((224, 224, 3), np.uint8))
            for w in windows
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=200)
    args = parser.parse_args()
    cv2.setNumThreads(1)  # one decode thread per worker, as in the batch path
    resamplers = {"pillow-bilinear": pillow, "opencv (area/linear)": opencv, "opencv-area": opencv_area}
    for name, work in cases(args.images).items():
        times: dict[str, list[float]] = {r: [] for r in resamplers}
        for round_ in range(args.rounds):
            order = list(resamplers) if round_ % 2 == 0 else list(reversed(resamplers))
            for r in order:
                start = time.perf_counter()
                for src, dst in work:
                    resamplers[r](src, dst)
                times[r].append((time.perf_counter() - start) / len(work) * 1e3)
        summary = ", ".join(f"{r} {statistics.median(t):.3f} ms" for r, t in times.items())
        print(f"{name}: {summary}")


if __name__ == "__main__":
    main()
