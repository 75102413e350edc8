"""Scanning a label file (CSV, TSV or JSON lines) of image paths and labels into a ``SourceScan``.

This is the source for ``pack imagelist``: ImageNet-style validation label files, Kaggle CSVs.
Each row names an image (relative to ``root``, or absolute inside it) and its label, an integer
or a class name. Classes come from ``classes`` (a file with one name per line) when given, else
from the labels: integers 0..max (named "0", "1", ...) when every label is an integer, otherwise
the sorted distinct names, as ImageFolder sorts folders. The scan keeps the list's order; the
pack then writes a seeded shuffle of it (``--order shuffled``, the default) or that order
(``--order source``), as for every source.

Rows that cannot be packed are skipped with a reason naming the line (missing file, unknown
label, duplicate path, a path outside the root, an empty field), and land in the manifest's
``skipped`` like images that fail to decode.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.scan.rows import PathCheck, fields_schema, scan_rows
from packer.scan.rows import Row as RowsRow
from packer.sources._list_labels import INTEGER, NO_CLASS, label_resolver, no_class, shown, unknown_label
from packer.sources.source import SourceItem, SourceScan
from readers.errors import ImgpackError
from readers.fields.field_schema import INT64, FieldError, encode, normalise

PATH_COLUMNS = ("path", "file", "filename", "file_name", "image", "image_path", "img", "image_id", "id")
LABEL_COLUMNS = ("label", "class", "class_name", "category", "target", "label_id")
LIST_KINDS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


@dataclass
class Row:
    line: int
    path: str
    label: Any
    problem: str = ""  # why the row cannot be used at all (its path or label has the wrong type)
    fields: dict[str, Any] = field(default_factory=dict)  # the other columns / JSON keys


def _json_row(number: int, entry: dict, path_key: str, label_key: str | None) -> Row:
    path = entry.get(path_key, "")
    label = entry.get(label_key, "") if label_key is not None else NO_CLASS
    extra = {k: v for k, v in entry.items() if k not in (path_key, label_key)}
    if not isinstance(path, str):
        return Row(number, "", label, f"path {shown(path)} is not a string")
    if isinstance(label, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in label):
        return Row(number, path, label, fields=extra)  # several labels (--multi-label)
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        return Row(number, path, "", f"label {shown(label)} is neither an integer nor a class name")
    return Row(number, path, label, fields=extra)


def _cell_value(text: str) -> Any:
    """A CSV cell typed from its text: an integer (int64), a number, else the text ("" is no
    value). Digits beyond int64 stay text: such a cell is an id, and a float would round it."""
    text = text.strip()
    if not text:
        return None
    if INTEGER.fullmatch(text):
        whole = int(text) if len(text) <= 20 else None
        return whole if whole is not None and INT64[0] <= whole <= INT64[1] else text
    try:
        number = float(text)
    except ValueError:
        return text
    return number if number == number and abs(number) != float("inf") else text


def _json_integer(text: str) -> int | str:
    # Python refuses to convert integers of more than 4300 digits; keep them as text (an
    # integer label that is out of range anyway) so the row is skipped, not the list refused.
    return int(text) if len(text) <= 100 else text


def list_kind(path: Path) -> str:
    kind = LIST_KINDS.get(path.suffix.lower())
    if kind is None:
        raise ImgpackError(
            f"{path}: unknown list type {path.suffix!r}; name it .csv, .tsv (or tab-separated .txt) or .jsonl"
        )
    return kind


def _pick(columns: list[str], wanted: str | None, known: tuple[str, ...], what: str, where: Path) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise ImgpackError(f"{where}: no column {wanted!r} (columns: {', '.join(columns)})")
        return wanted
    lowered = {c.lower(): c for c in columns}
    for name in known:
        if name in lowered:
            return lowered[name]
    hint = " (or --no-label for a set without classes: captions, tags)" if what == "label" else ""
    raise ImgpackError(
        f"{where}: cannot tell which column holds the {what} (columns: {', '.join(columns)}); "
        f"pass --{what}-column NAME{hint}"
    )


def read_rows(
    list_path: Path,
    path_column: str | None = None,
    label_column: str | None = None,
    header: bool = True,
    no_label: bool = False,
) -> list[Row]:
    """The (line, path, label) rows of a list file; columns found by name (or position without
    header); ``no_label``: the list has no label column, every row's label is ``NO_CLASS``."""
    kind = list_kind(list_path)
    try:
        # decoded from bytes so that quoted CSV fields keep their own newlines ("\r\n" included)
        text = list_path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ImgpackError(f"{list_path}: no such list file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ImgpackError(f"{list_path}: cannot read the list ({exc}); it must be UTF-8 text") from None
    rows: list[Row] = []
    if kind == "jsonl":
        keys: list[str] | None = None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line, parse_int=_json_integer)
            except json.JSONDecodeError as exc:
                raise ImgpackError(f"{list_path}: line {number} is not JSON ({exc.msg})") from None
            except RecursionError:  # a row is skipped, as a field that does not fit its kind
                rows.append(Row(number, "", "", "JSON nested too deeply (over about 1,000 levels)"))
                continue
            if not isinstance(entry, dict):
                raise ImgpackError(f"{list_path}: line {number} is not a JSON object")
            if keys is None:  # the first object names the keys; later rows lacking one are skipped
                keys = list(entry)
                path_key = _pick(keys, path_column, PATH_COLUMNS, "path", list_path)
                label_key = None if no_label else _pick(keys, label_column, LABEL_COLUMNS, "label", list_path)
            rows.append(_json_row(number, entry, path_key, label_key))
        return rows
    numbered = [(n, r) for n, r in _csv_records(list_path, text, kind) if any(cell.strip() for cell in r)]
    if not numbered:
        return rows
    if header:
        (_, names), numbered = numbered[0], numbered[1:]
        names = [n.strip() for n in names]
        p_at = names.index(_pick(names, path_column, PATH_COLUMNS, "path", list_path))
        l_at = -1 if no_label else names.index(_pick(names, label_column, LABEL_COLUMNS, "label", list_path))
    else:
        try:
            p_at, l_at = int(path_column or 0), -1 if no_label else int(label_column or 1)
        except ValueError:
            raise ImgpackError(
                "without a header, --path-column/--label-column are column numbers (0, 1)"
            ) from None
    for number, cells in numbered:
        if max(p_at, l_at) >= len(cells):
            rows.append(Row(number, cells[p_at].strip() if p_at < len(cells) else "", ""))
        else:
            extra = {}
            if header:
                extra = {
                    name: _cell_value(cells[at])
                    for at, name in enumerate(names)
                    if at not in (p_at, l_at) and at < len(cells) and name
                }
            label = cells[l_at].strip() if l_at >= 0 else NO_CLASS
            rows.append(Row(number, cells[p_at].strip(), label, fields=extra))
    return rows


def _csv_records(list_path: Path, text: str, kind: str) -> list[tuple[int, list[str]]]:
    """(line the record starts on, cells) of the whole text, parsed as one stream: a quoted field
    may hold newlines."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="," if kind == "csv" else "\t")
    records: list[tuple[int, list[str]]] = []
    start = 1
    try:
        for cells in reader:
            records.append((start, cells))
            start = reader.line_num + 1
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            reason = f"a field is longer than {csv.field_size_limit():,} characters"
        else:
            reason = f"not valid {kind.upper()} ({exc})"
        raise ImgpackError(f"{list_path}: line {start}: {reason}; fix that line") from None
    return records


def read_classes(path: Path) -> list[str]:
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines()]
    except OSError as exc:
        raise ImgpackError(f"{path}: cannot read the classes file ({exc.strerror or exc})") from None
    names = [n for n in names if n]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ImgpackError(f"{path}: class name(s) listed twice: {', '.join(duplicated[:5])}")
    if not names:
        raise ImgpackError(f"{path}: no class names (one per line)")
    return names


def scan_list(
    list_path: str | os.PathLike,
    root: str | os.PathLike | None = None,
    classes_file: str | os.PathLike | None = None,
    path_column: str | None = None,
    label_column: str | None = None,
    header: bool = True,
    suffix: str = "",
    fields: Sequence[str] | None = None,
    no_fields: bool = False,
    multi_label: str | None = None,
    no_label: bool = False,
) -> SourceScan:
    """The ``SourceScan`` of a label file, with the rows it could not use in ``skipped``.

    Every other column (JSON key) is a per-sample field, typed from the data (readers/fields/field_schema.py),
    or only those named in ``fields``, or none (``no_fields``). ``multi_label``: the label column
    holds several labels, split at this separator (or a JSON list); such a sample's label is -1
    and its class indices are the field "labels". ``no_label``: the list has no label column (a
    caption set): every sample's label is -1, no class; a label of -1 means that in any list."""
    list_path = Path(list_path).expanduser()
    root = Path(root).expanduser() if root is not None else list_path.parent
    if not root.is_dir():
        raise ImgpackError(
            f"{root}: --root is not a folder; give the folder the list's paths are relative to"
        )
    if no_label and (label_column is not None or multi_label is not None):
        raise ImgpackError(
            "--no-label packs a list without a label column: leave out --label-column/--multi-label"
        )
    rows = read_rows(list_path, path_column, label_column, header, no_label)
    if multi_label is None:  # a JSON list of labels is for --multi-label only
        for row in rows:
            if isinstance(row.label, list) and not row.problem:
                row.problem = f"label {shown(row.label)} is neither an integer nor a class name"
                row.label = ""
    else:
        return _scan_multi_label(list_path, root, rows, classes_file, suffix, fields, no_fields, multi_label)
    classes, resolve = label_resolver(rows, read_classes(Path(classes_file)) if classes_file else None)
    classes = classes or ["0"]  # a set without classes: a placeholder, as every source records it
    schema = _select_fields(list_path, rows, fields, no_fields)
    check = PathCheck(root)
    items: list[SourceItem] = []
    skipped: list[dict[str, str]] = []
    for row in rows:
        where = f"{list_path.name} line {row.line}"
        if row.problem:
            skipped.append({"path": row.path or f"<{where}>", "reason": f"{where}: {row.problem}"})
            continue
        if not row.path:
            skipped.append({"path": f"<{where}>", "reason": f"{where}: empty path"})
            continue
        full, rel, problem = check.locate(row.path + suffix, where, seen_as=f"line {row.line}")
        if problem:
            skipped.append({"path": rel, "reason": problem})
            continue
        label = NO_CLASS if no_class(row.label) else resolve(row.label) if str(row.label).strip() else None
        if str(row.label).strip() == "":
            skipped.append({"path": rel, "reason": f"{where}: no label"})
        elif label is None:
            skipped.append(
                {"path": rel, "reason": f"{where}: {unknown_label(row, rows, classes, classes_file)}"}
            )
        elif not os.path.isfile(full):
            skipped.append({"path": rel, "reason": f"{where}: file not found under {root}"})
        else:
            try:
                values = encode(normalise(schema, row.fields)).decode() if schema else ""
            except FieldError as exc:
                skipped.append({"path": rel, "reason": f"{where}: {exc}"})
                continue
            items.append(SourceItem(len(items), full, rel, label, values))
    if not items:
        first = f"; first problem: {skipped[0]['reason']}" if skipped else ""
        raise ImgpackError(f"{list_path}: no usable rows ({len(skipped)} skipped){first}")
    used = {item.label for item in items}
    empty = [name for i, name in enumerate(classes) if i not in used]
    return SourceScan(
        root, classes, items, empty, skipped=skipped, extra={"list": str(list_path.resolve())}, fields=schema
    )


def _select_fields(
    list_path: Path, rows: list[Row], wanted: Sequence[str] | None, none: bool
) -> dict[str, str]:
    """The schema of the fields kept: every other column (``wanted`` None), those named, or none."""
    if none:
        for row in rows:
            row.fields = {}
        return {}
    if wanted is not None:
        columns = {name for row in rows for name in row.fields}
        unknown = [name for name in wanted if name not in columns]
        if unknown:
            raise ImgpackError(
                f"{list_path}: --fields names {', '.join(unknown)}, not a column of the list "
                f"(columns besides path and label: {', '.join(sorted(columns)) or 'none'})"
            )
        for row in rows:
            row.fields = {k: v for k, v in row.fields.items() if k in wanted}
    return fields_schema([RowsRow(r.path, 0, r.fields) for r in rows if not r.problem], None, str(list_path))


def _scan_multi_label(
    list_path: Path,
    root: Path,
    rows: list[Row],
    classes_file: str | os.PathLike | None,
    suffix: str,
    wanted: Sequence[str] | None,
    none: bool,
    separator: str,
) -> SourceScan:
    """``scan_list`` for a label column holding several labels: classes from every label (or
    ``classes_file``), each sample labelled -1 with its class indices in the field "labels"."""
    parts = {id(row): _label_parts(row.label, separator) for row in rows}
    singles = [Row(r.line, r.path, part) for r in rows if not r.problem for part in parts[id(r)]]
    classes, resolve = label_resolver(singles, read_classes(Path(classes_file)) if classes_file else None)
    schema = _select_fields(list_path, rows, wanted, none)
    out: list[RowsRow] = []
    skipped: list[dict[str, str]] = []
    for row in rows:
        where = f"{list_path.name} line {row.line}"
        if row.problem or not row.path:
            reason = f"{where}: {row.problem or 'empty path'}"
            skipped.append({"path": row.path or f"<{where}>", "reason": reason})
            continue
        labels = [resolve(part) for part in parts[id(row)]]
        if None in labels:
            bad = parts[id(row)][labels.index(None)]
            reason = f"{where}: unknown label {bad!r} ({len(classes)} classes)"
            skipped.append({"path": row.path, "reason": reason})
            continue
        out.append(RowsRow(row.path + suffix, -1, {**row.fields, "labels": labels}, where))
    full_schema = {**schema, "labels": "ints"}
    extra = {"list": str(list_path.resolve())}
    return scan_rows(out, root, classes, full_schema, skipped, extra, str(list_path))


def _label_parts(label: Any, separator: str) -> list[Any]:
    if isinstance(label, list):
        return label
    return [part.strip() for part in str(label).split(separator) if part.strip()]
