"""``pack parquet``: pack a Parquet/Arrow table of images (bytes or paths), like ``pack imagefolder``.

The command takes every preprocessing, engine and output option of a pack (packer/commands/pack_cli.py)
and packs ``packer.sources.parquet_source``'s scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from packer.commands.cli_options import scratch_folder
from packer.scan.source_kind import Source

PARQUET_HELP = """Pack the images of the Parquet/Arrow TABLE (a column of image bytes or paths) into OUT.

\b
pack parquet train-00000.parquet --to lmdb -o train.lmdb
pack parquet index.parquet --root ~/imgs --image-column file --label-column cls --to tar -o out

Every column besides the image and the label is a per-sample field (typed from its values).
Image bytes are written to a temporary folder (--workdir) for the pack and removed after.
"""


@contextmanager
def scan(table: str, root: str | None, image_column: str | None, label_column: str | None,
         workdir: str | None, storage_options: Any = None) -> Iterator[Any]:  # fmt: skip
    from packer.sources.parquet_source import parquet_source

    with scratch_folder(workdir, "imgpack-parquet-", "the image bytes") as scratch:
        yield parquet_source(table, scratch, root, image_column, label_column)


PARAMS = (
    click.Argument(["table"], metavar="TABLE", type=click.Path(path_type=str)),
    click.Option(["--root"], type=click.Path(path_type=str), default=None,
                 help="Folder image paths are relative to."),
    click.Option(["--image-column"], default=None, help="Column with the image bytes or paths."),
    click.Option(["--label-column"], default=None, help="Column with the label (integers or names)."),
    click.Option(["--workdir"], type=click.Path(path_type=str, file_okay=False), default=None,
                 help="Where image bytes are written for the pack [default: a temporary folder]."),
)  # fmt: skip
SOURCE = Source(name="parquet", help=PARQUET_HELP, params=PARAMS, scan=scan, resumable=False)
