"""A planted near-duplicate set: distinct images, each copied with the edits scraped sets are full
of (resize 50-200%, JPEG quality 30-95, crops up to 10% per side, brightness +-10%).

Distinct images are the repository's photos (sample_data/) and synthetic ones (smooth random
fields with shapes and texture, each from its own seed). Every function is a pure function of
its arguments, so the tests and packer/bench/suites/dedup.py see the same set.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

PHOTO_ROOT = Path(__file__).resolve().parents[2] / "sample_data"
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class Edit:
    scale: float
    quality: int
    crop: tuple[float, float, float, float]  # left, top, right, bottom: fractions of the side
    brightness: float

    def describe(self) -> str:
        crop = "/".join(f"{c:.2f}" for c in self.crop)
        return f"scale {self.scale:.2f}, q{self.quality}, crop {crop}, brightness {self.brightness:.2f}"


DISTINCT_BITS = 16  # sample_data holds variants of some photos (PNG, CMYK, larger): one of each


def photos(limit: int | None = None) -> list[Image.Image]:
    """The repository's distinct photos, in RGB, largest side at most 512 (sorted by path): a
    photo whose hash is within DISTINCT_BITS of one taken before is a variant, left out."""
    from readers.store.sample_hashes import phash_of_image

    paths = sorted(p for p in PHOTO_ROOT.rglob("*") if p.suffix.lower() in PHOTO_SUFFIXES)
    out: list[Image.Image] = []
    seen: list[int] = []
    for path in paths:
        if limit is not None and len(out) >= limit:
            break
        with Image.open(path) as opened:
            img = opened.convert("RGB")
            img.thumbnail((512, 512))
        h = phash_of_image(img)
        if all((h ^ other).bit_count() > DISTINCT_BITS for other in seen):
            out.append(img)
            seen.append(h)
    return out


def synthetic(seed: int, size: tuple[int, int] = (320, 240)) -> Image.Image:
    """A distinct, photo-like image: a smooth colour field, a few shapes, fine texture."""
    rng = np.random.default_rng(seed)
    w, h = size
    coarse = rng.uniform(0, 255, (4 + seed % 3, 5 + seed % 4, 3)).astype(np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    img = Image.fromarray(field.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        x1, y1 = x0 + int(rng.integers(15, w // 2)), y0 + int(rng.integers(15, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    pixels = np.asarray(img, dtype=np.float32) + rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


KINDS = ("resize", "quality", "crop", "brightness", "combined")  # one copy of each, per image
NO_CROP = (0.0, 0.0, 0.0, 0.0)


def random_edit(rng: np.random.Generator, kind: str = "combined") -> Edit:
    """An edit of one ``kind``: a resize, a recompression, a crop, a brightness change, or all."""
    scale, quality = float(rng.uniform(0.5, 2.0)), int(rng.integers(30, 96))
    crop = (
        float(rng.uniform(0, 0.10)),
        float(rng.uniform(0, 0.10)),
        float(rng.uniform(0, 0.10)),
        float(rng.uniform(0, 0.10)),
    )
    brightness = float(rng.uniform(0.9, 1.1))
    if kind == "combined":
        return Edit(scale, quality, crop, brightness)
    return Edit(
        scale if kind == "resize" else 1.0,
        quality if kind == "quality" else 95,
        crop if kind == "crop" else NO_CROP,
        brightness if kind == "brightness" else 1.0,
    )


def apply_edit(img: Image.Image, edit: Edit) -> bytes:
    """The JPEG bytes of ``img`` edited by ``edit``."""
    w, h = img.size
    left, top, right, bottom = edit.crop
    box = (round(w * left), round(h * top), w - round(w * right), h - round(h * bottom))
    out = img.crop(box)
    size = (max(8, round(out.width * edit.scale)), max(8, round(out.height * edit.scale)))
    out = out.resize(size, Image.Resampling.LANCZOS)
    out = ImageEnhance.Brightness(out).enhance(edit.brightness)
    buffer = io.BytesIO()
    out.save(buffer, format="JPEG", quality=edit.quality)
    return buffer.getvalue()


def jpeg_bytes(img: Image.Image, quality: int = 92) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def planted(
    distinct: int, kinds: tuple[str, ...] = KINDS, seed: int = 0, with_photos: bool = True
) -> Iterator[tuple[int, int, bytes, Edit | None]]:
    """(image id, copy number, JPEG bytes, edit) of ``distinct`` images (the photos first), copy 0
    the image itself, copy k an edit of ``kinds[k - 1]``."""
    rng = np.random.default_rng(seed)
    base = photos(distinct) if with_photos else []
    base += [synthetic(seed * 100_003 + i) for i in range(distinct - len(base))]
    for image_id, img in enumerate(base):
        yield image_id, 0, jpeg_bytes(img), None
        for copy, kind in enumerate(kinds, 1):
            edit = random_edit(rng, kind)
            yield image_id, copy, apply_edit(img, edit), edit


def write_planted(
    folder: Path, distinct: int, kinds: tuple[str, ...] = KINDS, seed: int = 0
) -> list[tuple[str, int, int]]:
    """The planted set as an image folder (one class), files named by image and copy; the
    (relative path, image id, copy) of each, in name order."""
    out = []
    (folder / "all").mkdir(parents=True, exist_ok=True)
    for image_id, copy, data, _ in planted(distinct, kinds, seed):
        rel = f"all/img{image_id:05d}_c{copy}.jpg"
        (folder / rel).write_bytes(data)
        out.append((rel, image_id, copy))
    return sorted(out)
