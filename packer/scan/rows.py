"""Rows with fields -> a ``SourceScan``: the one entry point every source with per-sample fields
uses (``pack imagelist`` after parsing its list, ``pack coco`` after parsing its annotations).

A ``Row`` is ``(path, label, fields)``: the image's path (relative to ``root``, or absolute inside
it), its class index (-1 for a sample without a single class, e.g. a COCO image with several
categories) and its fields (``{name: value}``, kinds in readers/fields/field_schema.py). ``scan_rows`` checks
each path (inside the root, symlinks included; no duplicate; the file exists) and each row's
fields against the schema (given, or inferred from the rows: an int column seen with a float is
widened to float; a field whose kinds do not mix, a NaN box or a caption that is not UTF-8 is a
skip naming the row's ``where``). The fields travel with the scan's compact table as one JSON
document per sample (packer/scan/source_items.py), never as per-item Python objects, and the scan's
``fields`` holds the schema the manifest records. Pack it with ``pack_rows`` (or
``packer.engine.pack_run.pack_folder(scan, ...)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.scan.source_items import SourceItem
from packer.sources.source import SourceScan
from readers.errors import ImgpackError
from readers.fields.field_schema import FieldError, check_schema, encode, infer_schema, normalise

# Integer labels without a class list imply classes 0..max: a label above this (or the row
# count, when larger) is a typo or an id, not a class, and would build that many class names.
MAX_IMPLIED_CLASSES = 100_000


@dataclass
class Row:
    path: str
    label: int
    fields: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # where the row came from ("list.csv line 7"), for skip reasons


class PathCheck:
    """Where each row's image is, refused (with a reason) when it leaves the root, repeats an
    earlier row's path or is missing."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = os.path.abspath(root)
        self.base_real = os.path.realpath(self.base)
        self.first: dict[str, str] = {}

    def locate(self, path: str, where: str, seen_as: str = "") -> tuple[str, str, str]:
        """(absolute path, path relative to the root, problem or ""); a later row with this path
        is called a duplicate of ``seen_as`` (default ``where``)."""
        full = os.path.normpath(os.path.join(self.base, path))
        if "\0" in path:  # no file name holds one, and realpath would raise on it
            return full, path, f"{where}: the path holds a NUL byte, which no file name can; fix the list"
        rel = os.path.relpath(full, self.base).replace(os.sep, "/")
        if rel == ".." or rel.startswith("../"):
            return full, path, f"{where}: outside --root {self.root}"
        # a symlink (to the file or a folder on its way) may leave the root: judge where it lands
        real = os.path.realpath(full)
        if os.path.commonpath([real, self.base_real]) != self.base_real:
            return full, rel, f"{where}: outside --root {self.root} (a symlink to {real})"
        if rel in self.first:
            return full, rel, f"{where}: duplicate of {self.first[rel]}"
        self.first[rel] = seen_as or where
        return full, rel, ""

    def missing(self, full: str, where: str) -> str:
        return "" if os.path.isfile(full) else f"{where}: file not found under {self.root}"


def implied_classes(labels: Sequence[int], rows: int) -> list[str]:
    """The classes ``"0"..str(max)`` that integer labels imply, ignoring labels above
    ``max(MAX_IMPLIED_CLASSES, rows)`` (``scan_rows`` then skips their rows as outside the
    classes) and -1 (no class); ``["0"]`` when no label is a class."""
    limit = max(MAX_IMPLIED_CLASSES, rows)
    top = max((label for label in labels if label < limit), default=-1)
    return [str(i) for i in range(top + 1)] if top >= 0 else ["0"]


def fields_schema(rows: Sequence[Row], declared: dict[str, str] | None, where: str) -> dict[str, str]:
    """The schema: ``declared`` (checked), else inferred from the rows. Fields whose kinds do not
    mix are left to ``normalise`` to skip row by row under the first kind seen."""
    if declared is not None:
        return check_schema(declared, where)
    schema, conflicts = infer_schema(row.fields for row in rows)
    for name in conflicts:
        first = next(kind for r in rows if (kind := _first_kind(r, name)))
        schema[name] = first
    return check_schema(schema, where)


def _first_kind(row: Row, name: str) -> str:
    from readers.fields.field_schema import kind_of

    value = row.fields.get(name)
    return "" if value is None else kind_of(value)


def scan_rows(
    rows: Iterable[Row],
    root: str | os.PathLike,
    classes: list[str],
    schema: dict[str, str] | None = None,
    skipped: list[dict[str, str]] | None = None,
    extra: dict[str, str] | None = None,
    where: str = "rows",
) -> SourceScan:
    """The ``SourceScan`` of ``rows`` (see the module docstring); rows that cannot be packed are
    appended to ``skipped`` with their reason. ``schema`` None: inferred from the rows."""
    root = Path(root).expanduser()
    rows = list(rows)
    schema = fields_schema(rows, schema, where)
    skipped = list(skipped or [])
    check = PathCheck(root)
    items: list[SourceItem] = []
    for row in rows:
        at = row.where or where
        full, rel, problem = check.locate(row.path, at)
        if not problem and not -1 <= row.label < len(classes):
            problem = (
                f"{at}: label {row.label} is outside the {len(classes)} classes (labels are class "
                "numbers 0..N-1, -1 for none; a far larger one is an id, not a class)"
            )
        problem = problem or check.missing(full, at)
        values = ""
        if not problem and schema:
            try:
                values = encode(normalise(schema, row.fields)).decode()
            except FieldError as exc:
                problem = f"{at}: {exc}"
        if problem:
            skipped.append({"path": rel or f"<{at}>", "reason": problem})
            continue
        items.append(SourceItem(len(items), full, rel, row.label, values))
    if not items:
        first = f"; first problem: {skipped[0]['reason']}" if skipped else ""
        raise ImgpackError(f"{where}: no usable rows ({len(skipped)} skipped){first}")
    used = {item.label for item in items}
    empty = [name for i, name in enumerate(classes) if i not in used]
    return SourceScan(root, classes, items, empty, skipped=skipped, extra=dict(extra or {}), fields=schema)


def pack_rows(
    rows: Iterable[Row],
    root: str | os.PathLike,
    classes: list[str],
    out: str | os.PathLike,
    fmt: str = "lmdb",
    schema: dict[str, str] | None = None,
    skipped: list[dict[str, str]] | None = None,
    **pack_options: Any,
):
    """Pack ``rows`` (their images below ``root``) into ``out``: ``scan_rows`` then
    ``packer.engine.pack_run.pack_folder`` with ``pack_options`` (spec=, workers=, options=, force=, ...)."""
    from packer.engine.pack_run import pack_folder

    scan = scan_rows(rows, root, classes, schema, skipped)
    return pack_folder(scan, out, fmt, **pack_options)
