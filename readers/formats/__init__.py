"""Registry of format readers: manifest ``format`` name -> "module:Class" (imported on use)."""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

from readers.errors import ManifestError
from readers.formats.base import FormatReader, dir_identity
from readers.manifest import Manifest, read_manifest
from readers.remote import is_url

READERS: dict[str, str] = {
    "lmdb": "readers.formats.lmdb:LmdbReader",
    "tar": "readers.formats.tar:TarReader",
    "hdf5": "readers.formats.hdf5:Hdf5Reader",
    "bmp": "readers.formats.bmp:BmpReader",
    "tfrecord": "readers.formats.tfrecord:TfrecordReader",
}


def load_registered(registry: dict[str, str], name: str, unknown: Exception) -> type:
    """Import the class a registry maps ``name`` to ("module:Class"), or raise ``unknown``."""
    target = registry.get(name)
    if target is None:
        raise unknown
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def reader_class(format_name: str) -> type[FormatReader]:
    known = ", ".join(sorted(READERS))
    error = ManifestError(f"unknown dataset format {format_name!r}; this imgpack reads: {known}")
    return load_registered(READERS, format_name, error)


def open_reader(path: str | os.PathLike, verify: bool = False, **options: Any) -> FormatReader:
    """The reader for the packed dataset at ``path`` (format detected from its manifest).

    ``path`` may be an fsspec URL (``s3://bucket/ds``); ``options`` go to the format's reader:
    every reader takes ``storage_options``, ``cache_dir`` and ``cache_size`` for remote datasets
    (see readers.remote_parts), some take more (tfrecord: ``check_crc``).
    """
    identity = None if is_url(path) else dir_identity(path)  # before the manifest is read
    manifest: Manifest = read_manifest(path, options.get("storage_options"))
    cls = reader_class(manifest.format)
    # A reader's own options and, through super().__init__, the remote ones every reader takes.
    params = [*inspect.signature(cls.__init__).parameters.values()]
    params += inspect.signature(FormatReader.__init__).parameters.values()
    accepted = {p.name for p in params if p.kind is not p.VAR_KEYWORD}
    unknown = sorted(k for k in options if k not in accepted)
    if unknown:
        names = ", ".join(unknown)
        raise ManifestError(f"{path}: the {manifest.format} reader does not take option(s) {names}")
    if manifest.format_version < cls.oldest_format_version:
        raise ManifestError(
            f"{path}: packed with format_version {manifest.format_version}, which this imgpack no "
            f"longer reads for {manifest.format} (checksums now cover labels and shapes); re-pack it "
            "with this version of imgpack"
        )
    if verify:
        manifest.check_seal()
    reader = cls(path, manifest, verify=verify, **options)
    if identity is not None:
        reader.pin_directory(identity)
    if not reader.remote:  # remote parts are checked as they are downloaded, on first use
        reader.check_parts()
    return reader


__all__ = ["READERS", "FormatReader", "open_reader", "reader_class"]
