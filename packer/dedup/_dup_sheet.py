"""The duplicates found by ``pack dups`` / ``pack overlap`` drawn side by side: one row a group
(or a pair: the sample of A, then the sample of B), each cell captioned with its dataset (A or
B), index and distance. Pillow only; the cell drawing follows packer/info/show.py."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image, ImageDraw

from packer.info.show import BACKGROUND, CAPTION, GAP, TEXT, caption_font
from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.image.decode import decode_array

Cell = tuple[int, int, str]  # (which dataset: 0 or 1, its index, caption)
MAX_ROWS = 50  # a sheet of the first groups: enough to judge them by eye


def save_rows_sheet(
    datasets: list[str], rows: list[list[Cell]], out: str | os.PathLike, cell: int = 128, storage_options=None
) -> int:
    """Write the sheet of ``rows`` (at most MAX_ROWS) to ``out`` (PNG); the rows drawn."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ImgpackError(f"{out}: the sheet is written as PNG; name it .png")
    rows = rows[:MAX_ROWS]
    readers = [open_reader(d, storage_options=storage_options) for d in datasets]
    try:
        columns = max((len(r) for r in rows), default=1)
        size = (columns * (cell + GAP) + GAP, max(1, len(rows)) * (cell + CAPTION + GAP) + GAP)
        sheet = Image.new("RGB", size, BACKGROUND)
        draw, font = ImageDraw.Draw(sheet), caption_font()
        for y_slot, row in enumerate(rows):
            for x_slot, (which, index, caption) in enumerate(row):
                record = readers[which].read_many([index])[0]
                image = Image.fromarray(decode_array(record).squeeze()).convert("RGB")
                image.thumbnail((cell, cell), Image.Resampling.BILINEAR)
                x, y = GAP + x_slot * (cell + GAP), GAP + y_slot * (cell + CAPTION + GAP)
                sheet.paste(image, (x + (cell - image.width) // 2, y + (cell - image.height) // 2))
                draw.text((x, y + cell + 1), caption, fill=TEXT, font=font)
    finally:
        for reader in readers:
            reader.close()
    try:
        sheet.save(out, format="PNG")
    except OSError as exc:
        raise ImgpackError(f"{out}: cannot write the sheet ({exc.strerror or exc})") from None
    return len(rows)
