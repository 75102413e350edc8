"""``pack imagelist``: pack the images a CSV/TSV/JSONL label file names, like ``pack imagefolder``.

The command takes every preprocessing, engine and output option of a pack (packer/commands/pack_cli.py)
and runs the same pack on the scan of the list instead of a class-folder tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from packer.scan.source_kind import Source

LIST_HELP = """Pack the images listed in LIST (CSV, TSV or JSONL with a path and a label column) into OUT.

\b
pack imagelist val.csv --root ~/data/val --to lmdb -o val.lmdb --resize 256
pack imagelist labels.jsonl --root imgs --classes classes.txt --to tar -o out

Labels are integers or class names; classes come from --classes (one name per line) or from
the labels. Every other column (JSON key) is kept as a per-sample field, typed from the data
(--fields a,b keeps some, --no-fields none). Missing files, unknown labels, duplicate paths and
field values of the wrong type are skipped with a reason.
"""


@contextmanager
def scan(list_file, root, classes, path_column, label_column, no_header, suffix, fields, no_fields,
         multi_label, no_label, storage_options=None) -> Iterator[Any]:  # fmt: skip
    from packer.sources.imagelist import scan_list
    from readers.errors import ImgpackError

    wanted = [name.strip() for name in fields.split(",") if name.strip()] if fields else None
    if wanted is not None and no_fields:
        raise ImgpackError("--fields keeps the named columns and --no-fields drops them all: pass one")
    yield scan_list(list_file, root, classes, path_column, label_column, not no_header, suffix,
                    wanted, no_fields, multi_label, no_label)  # fmt: skip


PARAMS = (
    click.Argument(["list_file"], metavar="LIST", type=click.Path(path_type=str)),
    click.Option(
        ["--root"],
        type=click.Path(path_type=str),
        default=None,
        help="Folder the list's paths are relative to [default: the list's folder].",
    ),
    click.Option(
        ["--classes"], type=click.Path(path_type=str), help="Class names, one per line, in label order."
    ),
    click.Option(["--path-column"], default=None, help="Column (or JSON key) with the image path."),
    click.Option(["--label-column"], default=None, help="Column (or JSON key) with the label."),
    click.Option(
        ["--no-label"],
        is_flag=True,
        help="The list has no label column (captions, tags): every sample's label is -1, no class.",
    ),
    click.Option(["--no-header"], is_flag=True, help="CSV/TSV without a header row (columns 0 and 1)."),
    click.Option(["--suffix"], default="", help="Appended to every path, e.g. .jpg for bare ids."),
    click.Option(
        ["--fields"],
        default=None,
        help="Keep only these other columns as per-sample fields (comma-separated) [default: all].",
    ),
    click.Option(["--no-fields"], is_flag=True, help="Keep no other column: path and label only."),
    click.Option(
        ["--multi-label"],
        metavar="SEP",
        default=None,
        help="The label column holds several labels split at SEP (or a JSON list): label -1, "
        "class indices in the field 'labels'.",
    ),
)
SOURCE = Source(name="imagelist", help=LIST_HELP, params=PARAMS, scan=scan)
