"""What a source is, as data: the one object the ``pack`` CLI and the tests ask about a source.

A source is one module (``packer/<name>_cli.py``, or a plugin's) holding a ``Source``, listed in
packer/scan/source_registry.py. This module is a leaf: it imports nothing of imgpack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class Source:
    name: str  # the command: pack NAME
    help: str  # its --help text
    # Its own arguments and options; the first one names what is packed (a path, a file...).
    params: Sequence[click.Parameter]
    # (**its params by name, storage_options=dict | None) -> a context yielding a SourceScan,
    # which may keep a scratch folder alive while the pack runs.
    scan: Callable[..., AbstractContextManager[Any]]
    resumable: bool = True  # False: the scan's files live in a scratch folder (no --resume)
