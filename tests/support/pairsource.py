"""A source defined outside imgpack, for tests/packer/test_pack_spec.py: a text file of ``path<TAB>class``
lines, paths relative to the file's folder (or ``--root``). The whole source is this module; it
joins with ``register_source(SOURCE)``, or in a subprocess
``IMGPACK_SOURCES=tests.support.pairsource:SOURCE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from packer.scan.rows import Row, scan_rows
from packer.scan.source_kind import Source
from packer.sources.source import SourceScan

PLUGIN = "tests.support.pairsource:SOURCE"


@contextmanager
def scan(pairs: str, root: str | None, storage_options: Any = None) -> Iterator[SourceScan]:
    lines = [line.split("\t") for line in Path(pairs).read_text(encoding="utf-8").splitlines() if line]
    classes = sorted({name for _, name in lines})
    rows = [
        Row(path, classes.index(name), where=f"{pairs} line {n}") for n, (path, name) in enumerate(lines, 1)
    ]
    yield scan_rows(rows, root or Path(pairs).parent, classes, where=pairs)


SOURCE = Source(
    name="pairs",
    help="Pack the images a PAIRS file names (path<TAB>class per line) into OUT.",
    params=(
        click.Argument(["pairs"], type=click.Path(path_type=str, dir_okay=False)),
        click.Option(["--root"], type=click.Path(path_type=str), default=None, help="Where the paths start."),
    ),
    scan=scan,
)
