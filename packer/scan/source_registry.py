"""The one list of sources: name -> ``Source``. Each becomes the command ``pack NAME``, taking its
own arguments and every option of a pack (packer/commands/pack_cli.py).

A source is a module holding a ``Source`` (packer/scan/source_kind.py): its name, its help, its own
click parameters and its ``scan``, a context manager called with those parameters by name (and
``storage_options``) that yields a ``packer.sources.source.SourceScan`` (it may keep a scratch folder
alive for the pack), and one line here. A source
defined elsewhere (a plugin, a test) joins with ``register_source(SOURCE)`` in this process, or
for every ``pack`` run through ``IMGPACK_SOURCES=package.module:SOURCE[,...]``.
"""

from __future__ import annotations

import os

from packer.commands.coco_cli import SOURCE as COCO
from packer.commands.imagefolder_cli import SOURCE as IMAGEFOLDER
from packer.commands.imagelist_cli import SOURCE as IMAGELIST
from packer.commands.parquet_cli import SOURCE as PARQUET
from packer.commands.webdataset_cli import SOURCE as WEBDATASET
from packer.scan.source_kind import Source
from readers.errors import ImgpackError
from readers.formats.format import load

PLUGINS_ENV = "IMGPACK_SOURCES"
_SOURCES: dict[str, Source] = {s.name: s for s in (IMAGEFOLDER, IMAGELIST, COCO, PARQUET, WEBDATASET)}
_plugins_loaded: set[str] = set()


def register_source(source: Source, replace: bool = False) -> Source:
    """Add ``source`` to the registry (``replace``: over a source of the same name)."""
    if not isinstance(source, Source):
        raise TypeError(
            f"register_source takes a packer.scan.source_kind.Source, not {type(source).__name__}"
        )
    if source.name in _SOURCES and _SOURCES[source.name] is not source and not replace:
        raise ImgpackError(f"a source named {source.name!r} is registered already; pick another name")
    _SOURCES[source.name] = source
    return source


def unregister_source(name: str) -> None:
    _SOURCES.pop(name, None)


def registered_sources() -> dict[str, Source]:
    """Every registered source by name, the built-in ones first, plugins from ``IMGPACK_SOURCES``."""
    for target in filter(None, (t.strip() for t in os.environ.get(PLUGINS_ENV, "").split(","))):
        if target in _plugins_loaded:
            continue
        try:
            source = load(target)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImgpackError(
                f"{PLUGINS_ENV}={target}: cannot load that source ({exc}); give module:SOURCE"
            ) from exc
        _plugins_loaded.add(target)
        register_source(source, replace=True)
    return dict(_SOURCES)
