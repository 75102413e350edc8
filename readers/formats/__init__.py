"""Formats: each one a package below this one (``lmdb/``, ``tar/``...), listed in registry.py.

A format's package holds its reader, its writer and its ``Format`` (format.py); the base classes
of both directions live here beside each other. ``packer`` imports ``readers`` and never the
reverse; a format's ``writer.py`` is imported by name (``registry.open_writer``), by the packer
only, so a training job imports no writer. ``open_reader`` (below) opens a packed dataset with the
reader its manifest's ``format`` names. Public modules:

- ``format``: ``Format``, what a format is, as data;
- ``registry``: the list of formats, ``register_format``, ``open_writer``;
- ``base``: ``FormatReader``, the reader interface every format implements;
- ``part_files``: a dataset's part files, opened lazily and checked against the manifest;
- ``writer_base``: ``PartWriter`` and ``FormatWriter``, the writer interface;
- ``rolling_writer``: shard files that roll over by size and count, with an index beside each;
- ``packed_sample``: ``PackedSample`` and ``PreprocessSpec``, what a writer is handed;
- ``pack_option``: ``PackOption``, a format's pack option as data;
- ``label_file``: every label as one file of int64s beside the shards (tar, tfrecord).
"""

from __future__ import annotations

import os
from typing import Any

from readers.errors import ManifestError, OptionError
from readers.formats.base import FormatReader
from readers.formats.format import Format
from readers.formats.part_files import dir_identity, shards_holding
from readers.formats.registry import (
    format_named,
    format_names,
    register_format,
    registered,
    unregister_format,
)
from readers.remote.urls import is_url
from readers.store.manifest import Manifest, read_manifest


def reader_class(format_name: str) -> type[FormatReader]:
    def unknown(known: str) -> ManifestError:
        return ManifestError(f"unknown dataset format {format_name!r}; this imgpack reads: {known}")

    return format_named(format_name, unknown).reader_class()


def open_reader(
    path: str | os.PathLike, verify: bool = False, *, only_samples: Any = None, **options: Any
) -> FormatReader:
    """The reader for the packed dataset at ``path`` (format detected from its manifest).

    ``path`` may be an fsspec URL (``s3://bucket/ds``); ``options`` go to the format's reader:
    every reader takes ``storage_options``, ``cache_dir`` and ``cache_size`` for remote datasets
    (see readers.remote.remote_parts), some take more (tfrecord: ``check_crc``). ``only_samples``: the
    sample indices that will be read (a view's, readers/datasets/views.py): only the parts holding them
    are checked on open.
    """
    identity = None if is_url(path) else dir_identity(path)  # before the manifest is read
    manifest: Manifest = read_manifest(path, options.get("storage_options"))
    from readers.datasets.views import (  # here: readers.datasets.views imports formats.base
        VIEW_FORMAT,
        open_view,
    )

    if manifest.format == VIEW_FORMAT:  # a subset of another dataset (readers/datasets/views.py)
        view = open_view(path, manifest, open_reader, verify=verify, **options)
        view.pin_directory(identity)
        return view
    cls = reader_class(manifest.format)
    fmt = format_named(manifest.format)
    unknown = sorted(k for k in options if not fmt.accepts_reader_option(k))
    if unknown:
        names = ", ".join(unknown)
        raise OptionError(f"{path}: the {manifest.format} reader does not take option(s) {names}")
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
    if reader.remote:  # remote parts are checked as they are downloaded, on first use
        return reader
    if only_samples is None:
        reader.check_parts()
    else:
        reader.check_parts_of(shards_holding(manifest, only_samples))
    return reader


__all__ = [
    "Format",
    "FormatReader",
    "format_named",
    "format_names",
    "open_reader",
    "reader_class",
    "register_format",
    "registered",
    "unregister_format",
]
