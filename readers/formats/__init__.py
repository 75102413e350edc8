"""Registry of format readers: manifest ``format`` name -> "module:Class" (imported on use)."""

from __future__ import annotations

import importlib
import os

from readers.errors import ManifestError
from readers.formats.base import FormatReader
from readers.manifest import Manifest, read_manifest

READERS: dict[str, str] = {
    "lmdb": "readers.formats.lmdb:LmdbReader",
}


def reader_class(format_name: str) -> type[FormatReader]:
    target = READERS.get(format_name)
    if target is None:
        known = ", ".join(sorted(READERS))
        raise ManifestError(f"unknown dataset format {format_name!r}; this imgpack reads: {known}")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def open_reader(path: str | os.PathLike, verify: bool = False) -> FormatReader:
    """The reader for the packed dataset at ``path`` (format detected from its manifest)."""
    manifest: Manifest = read_manifest(path)
    return reader_class(manifest.format)(path, manifest, verify=verify)


__all__ = ["READERS", "FormatReader", "open_reader", "reader_class"]
