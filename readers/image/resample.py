"""The one CPU resampler, for pack time (``packer.transform.preprocess``) and every CPU read path.

OpenCV: its area filter when shrinking by 2x or more on both sides (an average over whole source
pixels, no aliasing), bilinear otherwise (for the milder shrinks of most random windows bilinear
aliases little, and the area filter at a non-integer factor costs several times as much; enlarging
is bilinear). Chosen over Pillow for speed on the read path: Pillow's antialiased bilinear measured 7-13x
slower per image on the batch path's resizes (docs/decisions.md). The
same function at pack time and read time means ``pack --resize N`` and ``resize=N`` of a losslessly
stored original give the same pixels. DALI's ``fn.resize`` (GPU or CPU) is its own resampler: see
docs/dali.md for how far apart they are.
"""

from __future__ import annotations

import cv2
import numpy as np

cv2.setNumThreads(1)  # resizing runs in many worker processes already

Pair = tuple[int, int]


def resize(src: np.ndarray, size: Pair, out: np.ndarray | None = None) -> np.ndarray:
    """``src`` (H, W) or (H, W, C) uint8, a strided window view is fine, resized to ``size``
    (height, width); written into ``out`` (same layout as the result) when given."""
    h, w = size
    if src.shape[:2] == (h, w):
        if out is None:
            return src
        out[...] = src.reshape(out.shape)
        return out
    far = src.shape[0] >= 2 * h and src.shape[1] >= 2 * w
    interpolation = cv2.INTER_AREA if far else cv2.INTER_LINEAR
    channels = src.shape[2] if src.ndim == 3 else 0
    if channels == 1:  # OpenCV reads and writes one channel as 2-D
        flat = out[:, :, 0] if out is not None else None
        result = cv2.resize(src[:, :, 0], (w, h), dst=flat, interpolation=interpolation)
        return out if out is not None else result[:, :, None]
    if out is not None:
        cv2.resize(src, (w, h), dst=out, interpolation=interpolation)
        return out
    return cv2.resize(src, (w, h), interpolation=interpolation)
