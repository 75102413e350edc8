"""``pack imagefolder``: pack an image folder ``SRC/<class>/<image>`` (local or a URL), the
source every other one is modelled on; its options are every pack's (packer/commands/pack_cli.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from packer.scan.source_kind import Source


@contextmanager
def scan(src: str, storage_options: dict[str, Any] | None = None) -> Iterator[Any]:
    from packer.sources.remote_source import scan_place

    yield scan_place(src, storage_options)


SOURCE = Source(
    name="imagefolder",
    help="Pack the image folder SRC (SRC/<class>/<image>) into OUT; either may be a URL (s3://...).",
    params=(click.Argument(["src"], type=click.Path(path_type=str)),),
    scan=scan,
)
