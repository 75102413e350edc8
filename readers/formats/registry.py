"""The one list of formats: name -> ``Format``. Everything that needs formats by name asks here.

A format defined elsewhere (a plugin, a test) joins with ``register_format(FORMAT)`` in this
process, or for every process of a run (the ``pack`` CLI, DataLoader and Ray workers) through
the environment: ``IMGPACK_FORMATS=package.module:FORMAT[,other.module:FORMAT]`` is read on the
first lookup. A writer is opened here (``open_writer``), handed its ``Format``; what needs every
format to say (which formats take an option, which store fields) is checked here too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from readers.errors import ImgpackError
from readers.formats.bmp import FORMAT as BMP
from readers.formats.format import Format, load
from readers.formats.hdf5 import FORMAT as HDF5
from readers.formats.lmdb import FORMAT as LMDB
from readers.formats.tar import FORMAT as TAR
from readers.formats.tfrecord import FORMAT as TFRECORD

if TYPE_CHECKING:
    from readers.formats.packed_sample import PreprocessSpec
    from readers.formats.writer_base import FormatWriter

PLUGINS_ENV = "IMGPACK_FORMATS"
_FORMATS: dict[str, Format] = {f.name: f for f in (LMDB, TAR, HDF5, BMP, TFRECORD)}
_plugins_loaded: set[str] = set()


def register_format(fmt: Format, replace: bool = False) -> Format:
    """Add ``fmt`` to the registry (``replace``: over a format of the same name)."""
    if not isinstance(fmt, Format):
        raise TypeError(f"register_format takes a readers.formats.Format, not {type(fmt).__name__}")
    if fmt.name in _FORMATS and _FORMATS[fmt.name] is not fmt and not replace:
        raise ImgpackError(f"a format named {fmt.name!r} is registered already; pick another name")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister_format(name: str) -> None:
    _FORMATS.pop(name, None)


def _load_plugins() -> None:
    for target in filter(None, (t.strip() for t in os.environ.get(PLUGINS_ENV, "").split(","))):
        if target in _plugins_loaded:
            continue
        try:
            fmt = load(target)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImgpackError(
                f"{PLUGINS_ENV}={target}: cannot load that format ({exc}); give module:FORMAT"
            ) from exc
        _plugins_loaded.add(target)
        register_format(fmt, replace=True)


def registered() -> dict[str, Format]:
    """Every registered format by name (sorted), plugins from ``IMGPACK_FORMATS`` included."""
    _load_plugins()
    return dict(sorted(_FORMATS.items()))


def format_names() -> list[str]:
    return list(registered())


def format_named(name: str, unknown: Callable[[str], Exception] | None = None) -> Format:
    """The format called ``name``; else ``unknown(known names)`` (default an ImgpackError) is raised."""
    formats = registered()
    if name not in formats:
        known = ", ".join(formats)
        raise unknown(known) if unknown else ImgpackError(f"unknown format {name!r}; choose one of {known}")
    return formats[name]


def formats_taking(option: str) -> list[str]:
    """Names of the formats whose pack options include ``option``."""
    return [name for name, fmt in registered().items() if fmt.pack_option(option) is not None]


def formats_storing_fields() -> list[str]:
    """Names of the formats that store per-sample fields (``Format.stores_fields``)."""
    return [f.name for f in registered().values() if f.stores_fields]


def open_writer(name: str, out: Path, spec: PreprocessSpec, options: dict[str, Any]) -> FormatWriter:
    """The writer of the format called ``name``, writing below ``out``, handed its ``Format``; an
    option given that another format takes and this one does not is refused, naming those."""
    fmt = format_named(name)
    refuse_foreign_options(fmt, options)
    writer: FormatWriter = fmt.writer_class()(fmt, Path(out), spec, options)
    return writer


def refuse_foreign_options(fmt: Format, options: dict[str, Any]) -> None:
    """Raise ImgpackError for a given option that another format uses and ``fmt`` does not."""
    for option in [k for k, v in options.items() if v is not None and fmt.pack_option(k) is None]:
        users = formats_taking(option)
        if users:  # options no format declares (engine settings) are not the formats' business
            flag = "--" + option.replace("_", "-")
            raise ImgpackError(
                f"{flag} does not apply to --to {fmt.name}; it is for --to {' or '.join(users)}: drop {flag}"
            )


def refuse_fields(fmt: Format, schema: dict[str, str]) -> None:
    """Raise ImgpackError when per-sample fields (``schema``) go to a format that stores none."""
    if schema and not fmt.stores_fields:
        raise ImgpackError(
            f"--to {fmt.name} does not store per-sample fields ({', '.join(schema)}); pack with "
            "--no-fields, or to a format that stores them: " + ", ".join(formats_storing_fields())
        )
