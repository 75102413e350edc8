"""``pack show``: a contact sheet of a packed dataset, to check it at a glance.

``n`` samples drawn at random (a function of ``seed``), optionally only of some classes, are
decoded as the readers decode them (so wrong colours, rotations or crops in the pack show up),
scaled to fit square cells and captioned with their class name and sample index. Pillow only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from readers.decode import decode_array
from readers.errors import ImgpackError
from readers.formats import open_reader

CAPTION = 14  # pixels under each cell for the caption
GAP = 4
BACKGROUND = (32, 32, 32)
TEXT = (235, 235, 235)


def pick_samples(
    labels: np.ndarray, classes: list[str], n: int, seed: int, wanted: Sequence[str] = ()
) -> np.ndarray:
    """Indices of up to ``n`` random samples (of the ``wanted`` class names, if given), by label."""
    if wanted:
        unknown = [w for w in wanted if w not in classes]
        if unknown:
            shown = ", ".join(classes[:20]) + (" ..." if len(classes) > 20 else "")
            raise ImgpackError(f"unknown class(es) {', '.join(unknown)}; the dataset has: {shown}")
        eligible = np.flatnonzero(np.isin(labels, [classes.index(w) for w in wanted]))
    else:
        eligible = np.arange(len(labels))
    rng = np.random.default_rng(seed)
    chosen = rng.choice(eligible, size=min(n, len(eligible)), replace=False)
    return chosen[np.lexsort((chosen, labels[chosen]))]


def _fit(text: str, draw: ImageDraw.ImageDraw, font, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def contact_sheet(
    dataset: str | os.PathLike, n: int = 64, classes: Sequence[str] = (), seed: int = 0, cell: int = 128
) -> tuple[Image.Image, np.ndarray]:
    """The contact sheet of ``dataset`` (a Pillow RGB image) and the sample indices it shows."""
    if n < 1 or cell < 16:
        raise ImgpackError(f"--n {n} / --cell {cell}: show at least 1 image in cells of 16 px or more")
    reader = open_reader(dataset)
    names = list(reader.manifest.classes)
    chosen = pick_samples(reader.labels(), names, n, seed, classes)
    columns = max(1, math.ceil(math.sqrt(len(chosen))))
    rows = math.ceil(len(chosen) / columns)
    sheet = Image.new("RGB", (columns * (cell + GAP) + GAP, rows * (cell + CAPTION + GAP) + GAP), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for slot, (index, record) in enumerate(zip(chosen.tolist(), reader.read_many(chosen))):
        image = Image.fromarray(decode_array(record).squeeze()).convert("RGB")
        image.thumbnail((cell, cell), Image.Resampling.BILINEAR)
        x = GAP + (slot % columns) * (cell + GAP)
        y = GAP + (slot // columns) * (cell + CAPTION + GAP)
        sheet.paste(image, (x + (cell - image.width) // 2, y + (cell - image.height) // 2))
        caption = _fit(f"{names[record.label]} #{index}", draw, font, cell)
        draw.text((x, y + cell + 1), caption, fill=TEXT, font=font)
    return sheet, chosen


def save_contact_sheet(dataset: str | os.PathLike, out: str | os.PathLike, **options) -> np.ndarray:
    """Write the contact sheet of ``dataset`` to ``out`` (PNG); the sample indices shown."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ImgpackError(f"{out}: the contact sheet is written as PNG; name it .png")
    sheet, chosen = contact_sheet(dataset, **options)
    try:
        sheet.save(out, format="PNG")
    except OSError as exc:
        raise ImgpackError(f"{out}: cannot write the contact sheet ({exc.strerror or exc})") from None
    return chosen
