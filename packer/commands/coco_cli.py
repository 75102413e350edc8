"""``pack coco``: pack a COCO detection file's images with their boxes, like ``pack imagefolder``.

The command takes every preprocessing, engine and output option of a pack (packer/commands/pack_cli.py)
and packs the rows of ``packer.sources.coco.scan_coco``
through the one rows entry point (``packer.scan.rows``), so boxes and their categories are stored by
every format and moved with the image when ``--resize``/``--crop`` change it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from packer.scan.source_kind import Source

COCO_HELP = """Pack the images of the COCO detection file ANNOTATIONS, with their boxes, into OUT.

\b
pack coco instances_train2017.json --root ~/coco/train2017 --to tfrecord -o coco-tfr
pack coco instances_val2017.json --root ~/coco/val2017 --to lmdb -o val.lmdb --skip-empty

Fields: boxes (x, y, width, height in pixels, as COCO), categories and iscrowd (one per box;
categories index the classes: the category names sorted by id), image_id. The label is the
image's class when all its boxes are of one category, else -1. Images without boxes are kept
(--skip-empty drops them); bad annotations and missing files are skipped with a reason; boxes
reaching outside their image are clipped and counted.
"""


@contextmanager
def scan(annotations: str, root: str | None, skip_empty: bool, storage_options: Any = None) -> Iterator[Any]:
    from packer.sources.coco import coco_source

    yield coco_source(annotations, root, skip_empty)


SOURCE = Source(
    name="coco",
    help=COCO_HELP,
    params=(
        click.Argument(["annotations"], metavar="ANNOTATIONS", type=click.Path(path_type=str)),
        click.Option(
            ["--root"],
            type=click.Path(path_type=str),
            default=None,
            help="Folder COCO's file_names are relative to [default: the annotation file's folder].",
        ),
        click.Option(["--skip-empty"], is_flag=True, help="Drop images that have no box."),
    ),
    scan=scan,
)
