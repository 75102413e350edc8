"""Small source folders with planted copies, for tests/packer/dedup/ (test_dedup.py, test_overlap.py)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from PIL import Image

from packer.bench.planted import Edit, apply_edit, synthetic
from tests.conftest import SAMPLE_DATA

MILD = Edit(scale=0.7, quality=60, crop=(0.02, 0.01, 0.0, 0.03), brightness=1.05)  # a typical scraped copy


def jpeg_of(img: Image.Image, quality: int = 92) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def planted_folder(root: Path, seeds: range, classes: int = 2) -> dict[str, str]:
    """``root/<class>/s<seed>.jpg`` for each synthetic seed, plus an exact and a mild near copy of
    the first two in another class; {copy rel: original rel}."""
    for seed in seeds:
        folder = root / f"c{seed % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{seed}.jpg").write_bytes(jpeg_of(synthetic(seed)))
    first, second = seeds[0], seeds[1]
    orig_exact, orig_near = f"c{first % classes}/s{first}.jpg", f"c{second % classes}/s{second}.jpg"
    copies = root / f"c{(first + 1) % classes}"
    shutil.copyfile(root / orig_exact, copies / "exact_copy.jpg")
    (copies / "near_copy.jpg").write_bytes(apply_edit(synthetic(second), MILD))
    return {copies.name + "/exact_copy.jpg": orig_exact, copies.name + "/near_copy.jpg": orig_near}


def some_photos(root: Path, count: int = 6) -> None:
    """A few of sample_data's photos under ``root/photos`` (distinct from the synthetic images)."""
    (root / "photos").mkdir(parents=True, exist_ok=True)
    for path in sorted((SAMPLE_DATA / "objects").glob("*.jpg"))[:count]:
        shutil.copyfile(path, root / "photos" / path.name)
