"""The labels of a label file's rows (``pack imagelist``): integers or class names resolved to
class indices, -1 (``NO_CLASS``) for a sample without a class, and the reason a label is unknown.

Without ``--classes`` integer labels imply the classes ``0..max``, ignoring labels far above the
row count (``packer.scan.rows.MAX_IMPLIED_CLASSES``: an id or a typo would build that many names);
other labels are class names, sorted as ImageFolder sorts folders. Rows are ``packer.sources.imagelist``
rows (their ``label`` and ``problem``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from packer.scan.rows import MAX_IMPLIED_CLASSES

INTEGER = re.compile(r"-?[0-9]+")
NO_CLASS = -1  # the label of a sample without a class (a caption or tags set, --no-label)


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as a short text for a reason (a JSON value as JSON, a long one cut)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not INTEGER.fullmatch(text):
        return None
    # beyond any class count: not converted (Python refuses integers of more than 4300 digits)
    return int(text) if len(text) <= 18 else 10**18


def no_class(label: Any) -> bool:
    return _as_int(label) == NO_CLASS


def _implied_class_limit(rows: Sequence[Any]) -> int:
    return max(MAX_IMPLIED_CLASSES, len(rows))


def label_resolver(rows: Sequence[Any], classes: list[str] | None):
    """(classes, label of a row value or None if unknown)."""
    if classes is not None:
        names = {n: i for i, n in enumerate(classes)}

        def resolve(value: Any) -> int | None:
            if str(value) in names:
                return names[str(value)]
            number = _as_int(value)
            return number if number is not None and 0 <= number < len(classes) else None

        return classes, resolve
    values = [r.label for r in rows if not r.problem and str(r.label).strip() and not no_class(r.label)]
    numbers = [_as_int(v) for v in values]
    if values and all(n is not None for n in numbers):
        limit = _implied_class_limit(rows)
        top = max((n for n in numbers if n is not None and n < limit), default=-1)
        return [
            str(i) for i in range(top + 1)
        ], lambda v: n if (n := _as_int(v)) is not None and 0 <= n <= top else None
    found = sorted({str(v) for v in values})
    index = {n: i for i, n in enumerate(found)}
    return found, lambda v: index.get(str(v))


def unknown_label(row: Any, rows: Sequence[Any], classes: list[str], classes_file: Any) -> str:
    number = _as_int(row.label)
    text = str(row.label).strip()
    if classes_file is None and number is not None and number >= _implied_class_limit(rows):
        digits = f" ({len(text.lstrip('-'))} digits)" if len(text) > 18 else ""
        return (
            f"label {shown(text, 20)}{digits} is far above the number of rows ({len(rows)}); "
            "integer labels are class numbers 0..N-1: give --classes FILE to name the classes"
        )
    known = f"{len(classes)} classes" + (f" from {classes_file}" if classes_file else "")
    label = repr(row.label) if len(text) <= 60 else shown(text)
    return f"unknown label {label} ({known})"
