"""Registry of format writers: ``--to`` name -> "module:Class" (imported on use)."""

from __future__ import annotations

import importlib

from packer.formats.base import FormatWriter, PartResult, PartWriter
from readers.errors import ImgpackError

WRITERS: dict[str, str] = {
    "lmdb": "packer.formats.lmdb:LmdbWriter",
    "tar": "packer.formats.tar:TarWriter",
    "hdf5": "packer.formats.hdf5:Hdf5Writer",
    "bmp": "packer.formats.bmp:BmpWriter",
}


def writer_class(name: str) -> type[FormatWriter]:
    target = WRITERS.get(name)
    if target is None:
        raise ImgpackError(f"unknown format {name!r}; choose one of {', '.join(sorted(WRITERS))}")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


__all__ = ["WRITERS", "FormatWriter", "PartResult", "PartWriter", "writer_class"]
