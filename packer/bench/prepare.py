"""Benchmark inputs: a packed dataset made once and reused, and the naive Pillow preprocessing
that the peers' hand-written packers do in the suites (what a user writes without imgpack).

Imports Pillow and the packer only when called, so a measured naive packer stays light.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any


def ensure_packed(
    src: str | os.PathLike,
    out: str | os.PathLike,
    fmt: str,
    spec: Any,
    workers: int = 2,
    options: dict[str, Any] | None = None,
) -> Path:
    """``out``, packed from ``src`` with ``spec`` (a ``PreprocessSpec``) unless an earlier run
    left a complete dataset there (its manifest is written last)."""
    from packer.engine.pack_run import pack_folder
    from readers.store.manifest import MANIFEST_NAME

    out = Path(out)
    if not (out / MANIFEST_NAME).exists():
        pack_folder(src, out, fmt, spec, workers=workers, options=options, force=True)
    return out


def naive_jpeg(path: str | os.PathLike, size: int, crop: int | None = None, resample: Any = None) -> bytes:
    """Pillow open, RGB, shorter side to ``size``, optional centre ``crop``, JPEG quality 90."""
    from PIL import Image

    with Image.open(path) as opened:
        img: Image.Image = opened.convert("RGB")
        scale = size / min(img.size)
        target = (round(img.width * scale), round(img.height * scale))
        img = img.resize(target) if resample is None else img.resize(target, resample)
        if crop:
            left, top = (img.width - crop) // 2, (img.height - crop) // 2
            img = img.crop((left, top, left + crop, top + crop))
        buffer = io.BytesIO()
        img.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()
