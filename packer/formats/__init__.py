"""Registry of format writers: ``--to`` name -> "module:Class" (imported on use)."""

from __future__ import annotations

from packer.formats.base import FormatWriter, PartResult, PartWriter
from readers.errors import ImgpackError
from readers.formats import load_registered

WRITERS: dict[str, str] = {
    "lmdb": "packer.formats.lmdb:LmdbWriter",
    "tar": "packer.formats.tar:TarWriter",
    "hdf5": "packer.formats.hdf5:Hdf5Writer",
    "bmp": "packer.formats.bmp:BmpWriter",
    "tfrecord": "packer.formats.tfrecord:TfrecordWriter",
}


def writer_class(name: str) -> type[FormatWriter]:
    error = ImgpackError(f"unknown format {name!r}; choose one of {', '.join(sorted(WRITERS))}")
    return load_registered(WRITERS, name, error)


__all__ = ["WRITERS", "FormatWriter", "PartResult", "PartWriter", "writer_class"]
