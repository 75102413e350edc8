"""``pack show``: a contact sheet of a packed dataset, to check it at a glance.

``n`` samples drawn at random (a function of ``seed``), optionally only of some classes, are
decoded as the readers decode them (so wrong colours, rotations or crops in the pack show up),
scaled to fit square cells and captioned with their class name and sample index. A dataset
with boxes gets them drawn on the thumbnails; one with a text field (a caption) gets its first
line under the class. Text is drawn with a font that has non-ASCII glyphs (DejaVu Sans, from the
system or matplotlib's copy; Pillow's built-in font draws an "é" as a box). Pillow only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.image.decode import decode_array

CAPTION = 14  # pixels under each cell for each caption line
GAP = 4
BACKGROUND = (32, 32, 32)
TEXT = (235, 235, 235)
BOX = (255, 220, 0)
FONT_SIZE = 11
FONT_FILES = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
)


def caption_font(size: int = FONT_SIZE) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans (the system's, else matplotlib's bundled copy), else Pillow's default."""
    candidates = list(FONT_FILES)
    try:
        import matplotlib

        candidates.append(
            os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data/fonts/ttf/DejaVuSans.ttf")
        )
    except ImportError:
        pass
    for path in candidates:
        if os.path.isfile(path):
            try:
                return ImageFont.truetype(path, size)
            except OSError:
                continue
    return ImageFont.load_default(size=size)


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
    schema = dict(reader.manifest.fields)
    boxes_field = next((k for k, kind in schema.items() if kind == "boxes"), None)
    text_field = next((k for k, kind in schema.items() if kind == "str"), None)
    chosen = pick_samples(reader.labels(), names, n, seed, classes)
    columns = max(1, math.ceil(math.sqrt(len(chosen))))
    rows = math.ceil(len(chosen) / columns)
    below = CAPTION * (2 if text_field else 1)
    sheet = Image.new("RGB", (columns * (cell + GAP) + GAP, rows * (cell + below + GAP) + GAP), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = caption_font()
    for slot, (index, record) in enumerate(zip(chosen.tolist(), reader.read_many(chosen))):
        image = Image.fromarray(decode_array(record).squeeze()).convert("RGB")
        image.thumbnail((cell, cell), Image.Resampling.BILINEAR)
        x = GAP + (slot % columns) * (cell + GAP)
        y = GAP + (slot // columns) * (cell + below + GAP)
        left, top = x + (cell - image.width) // 2, y + (cell - image.height) // 2
        sheet.paste(image, (left, top))
        fields = record.fields if isinstance(record.fields, dict) else {}
        if boxes_field is not None and fields.get(boxes_field) is not None:
            scale = (image.width / record.width, image.height / record.height)
            _draw_boxes(draw, np.asarray(fields[boxes_field]), scale, (left, top))
        label = names[record.label] if 0 <= record.label < len(names) else "no class"
        draw.text((x, y + cell + 1), _fit(f"{label} #{index}", draw, font, cell), fill=TEXT, font=font)
        text = fields.get(text_field) if text_field else None
        if text:
            line = str(text).splitlines()[0] if str(text).strip() else ""
            draw.text((x, y + cell + CAPTION + 1), _fit(line, draw, font, cell), fill=TEXT, font=font)
    return sheet, chosen


def _draw_boxes(
    draw: ImageDraw.ImageDraw, boxes: np.ndarray, scale: tuple[float, float], at: tuple[int, int]
):
    """COCO xywh boxes (stored pixels) outlined on a thumbnail pasted at ``at``, scaled by ``scale``."""
    for x, y, w, h in boxes.reshape(-1, 4).tolist():
        x0, y0 = at[0] + x * scale[0], at[1] + y * scale[1]
        x1, y1 = x0 + max(w * scale[0] - 1, 0), y0 + max(h * scale[1] - 1, 0)
        draw.rectangle((x0, y0, x1, y1), outline=BOX)


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
