"""The writing side of the formats: the writer interface (base.py, rolling.py) and ``writer_class``.

Each format's writer lives in its own package (``readers/formats/<name>/writer.py``) and is
imported here, by the name its registry entry gives, only when a pack needs it.
"""

from __future__ import annotations

from packer.formats.base import FormatWriter, PartResult, PartWriter
from readers.formats.registry import format_named


def writer_class(name: str) -> type[FormatWriter]:
    return format_named(name).writer_class()


__all__ = ["FormatWriter", "PartResult", "PartWriter", "writer_class"]
