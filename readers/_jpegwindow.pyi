# Typed stub of the optional C extension built from csrc/jpegwindow.c (see readers/image/jpegwindow.py).
from typing_extensions import Buffer

def load(path: str, /) -> bool:
    """dlopen a libjpeg-turbo shared library (once per process); OSError naming it if unusable."""

def decode(
    data: Buffer,
    out: Buffer,
    top: int,
    left: int,
    height: int,
    width: int,
    eighths: int,
    gray: bool,
    fast_dct: bool,
    /,
) -> tuple[int, int, int, int] | None:
    """Rows [top, top+height) and at least columns [left, left+width) of the image scaled by
    eighths/8, into the C-contiguous ``out``: (row_width, skip, image_height, image_width), or None
    where the library cannot give exactly those pixels. ValueError for arguments outside
    0..65500 (eighths outside 1..16)."""
