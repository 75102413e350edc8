"""Test images for the JPEG window decoder's tests (test_jpegwindow.py)."""

from __future__ import annotations

import numpy as np


def textured_pixels(height: int, width: int, seed: int = 0) -> np.ndarray:
    """RGB gradients plus noise: every MCU differs, and chroma changes across every block edge."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * 7 + y * 3) % 256], -1)
    return np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
