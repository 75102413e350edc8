"""``pack webdataset``: re-pack WebDataset samples (a folder tree or tar shards), like ``pack imagefolder``.

The command takes every preprocessing, engine and output option of a pack (packer/commands/pack_cli.py)
and packs ``packer.sources.webdataset_source``'s scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from packer.commands.cli_options import scratch_folder
from packer.scan.source_kind import Source

WEBDATASET_HELP = """Pack WebDataset samples (files sharing a stem: x.jpg + x.cls/x.txt/x.json) into OUT.

\b
pack webdataset shards/ --to lmdb -o train.lmdb                 # a folder tree
pack webdataset data-000000.tar data-000001.tar --to hdf5 -o out.h5d

.cls is the class (classes 0..max), .txt the caption field, .json's keys fields of their own.
Tar shards are unpacked into a temporary folder (--workdir) for the pack and removed after.
"""


@contextmanager
def scan(sources: tuple[str, ...], workdir: str | None, storage_options: Any = None) -> Iterator[Any]:
    from packer.sources.webdataset_source import webdataset_source

    with scratch_folder(workdir, "imgpack-wds-", "the unpacked shards") as scratch:
        yield webdataset_source(list(sources), scratch)


PARAMS = (
    click.Argument(
        ["sources"], metavar="SOURCE...", nargs=-1, required=True, type=click.Path(path_type=str)
    ),
    click.Option(
        ["--workdir"],
        type=click.Path(path_type=str, file_okay=False),
        default=None,
        help="Where tar shards are unpacked for the pack [default: the system's temporary folder].",
    ),
)
SOURCE = Source(name="webdataset", help=WEBDATASET_HELP, params=PARAMS, scan=scan, resumable=False)
