"""The BMP cache: ``<class>/<stem>.bmp`` mirroring the source tree, plus ``files-000000.jsonl`` indexes."""

from __future__ import annotations

import re
from collections.abc import Sequence

from readers.formats.format import Format


def _class_folder(name: str, below: Sequence[str]) -> bool:
    return all(path.lower().endswith(".bmp") for path in below)


FORMAT = Format(
    name="bmp",
    reader="readers.formats.bmp.reader:BmpReader",
    writer="readers.formats.bmp.writer:BmpWriter",
    files=re.compile(r"files-\d{6}\.jsonl"),
    folder=_class_folder,
    dataset_files=re.compile(r"[^/]+\.bmp", re.IGNORECASE),
    remote_finish="local",  # finish renames every image into its class folder
    encodings=("bmp",),
    stores_fields=True,  # a 9th index column of JSON text, under each file's crc32
)
