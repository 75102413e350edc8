"""``pack parquet``: a Parquet (or Arrow IPC) table whose column holds image bytes or paths, the
layout of many published datasets, through the rows entry point (``packer.scan.rows``).

The image column is found by name (``image``, ``img``, ``jpg``, ``png``, ``path``, ``file_name``...)
or given; it holds bytes (a binary column, or a struct with a ``bytes`` member as Hugging Face
writes images) or paths relative to ``--root``. The label column (``label``, ``class``...; optional)
holds integers (whole floats count as integers, NaN as no label) or class names. Every other
column is a per-sample field, typed from its values (``readers.fields.field_schema``). Image bytes are written
to ``workdir`` (the packer reads image files), which the caller removes after the pack. Rows are
read a record batch at a time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from packer.scan.rows import Row, implied_classes, scan_rows
from packer.sources.source import SourceScan
from readers.errors import ImgpackError

IMAGE_COLUMNS = ("image", "img", "jpg", "jpeg", "png", "image_bytes", "path", "file_name", "filename", "file")
LABEL_COLUMNS = ("label", "labels", "class", "category", "target")


def _pick(names: list[str], wanted: str | None, known: tuple[str, ...], what: str, where: str) -> str | None:
    if wanted is not None:
        if wanted not in names:
            raise ImgpackError(f"{where}: no column {wanted!r} (columns: {', '.join(names)})")
        return wanted
    lowered = {n.lower(): n for n in names}
    found = next((lowered[k] for k in known if k in lowered), None)
    if found is None and what == "image":
        raise ImgpackError(
            f"{where}: cannot tell which column holds the images (columns: {', '.join(names)}); "
            "pass --image-column NAME"
        )
    return found


def _open_table(path: Path) -> Any:
    try:
        import pyarrow.ipc as ipc
        import pyarrow.parquet as pq
    except ImportError:
        raise ImgpackError('pack parquet needs pyarrow: pip install "imgpack[parquet]"') from None
    try:
        if path.suffix.lower() in (".arrow", ".feather", ".ipc"):
            return ipc.open_file(path).read_all()
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise ImgpackError(f"{path}: no such table file") from None
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet/Arrow
        raise ImgpackError(f"{path}: not a readable Parquet/Arrow table ({exc})") from None


def _batches(table: Any):
    if hasattr(table, "iter_batches"):
        yield from table.iter_batches(batch_size=1024)
    else:
        yield from table.to_batches(max_chunksize=1024)


def _image_bytes(value: Any) -> bytes | str | None:
    """The image of one cell: bytes, a path (str), or None."""
    if isinstance(value, dict):  # {"bytes": ..., "path": ...} as Hugging Face datasets store images
        return value.get("bytes") or value.get("path")
    return value


def parquet_source(
    table_path: str | os.PathLike,
    workdir: Path,
    root: str | os.PathLike | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
) -> SourceScan:
    """The ``SourceScan`` of a table (see the module docstring)."""
    path = Path(table_path).expanduser()
    where = path.name
    table = _open_table(path)
    names = list(table.schema_arrow.names if hasattr(table, "schema_arrow") else table.schema.names)
    image_key = _pick(names, image_column, IMAGE_COLUMNS, "image", where)
    label_key = _pick(names, label_column, LABEL_COLUMNS, "label", where)
    base = Path(root).expanduser() if root is not None else path.parent
    rows: list[Row] = []
    skipped: list[dict[str, str]] = []
    raw_labels: list[Any] = []
    written = False
    number = 0
    for batch in _batches(table):
        for record in batch.to_pylist():
            at = f"{where} row {number}"
            image = _image_bytes(record.pop(image_key))
            label = _label_value(record.pop(label_key), at, label_key) if label_key else None
            if image is None:  # a null cell: that row has no image, the others still pack
                reason = f"{at}: column {image_key!r} is null (no image)"
                skipped.append({"path": f"<{at}>", "reason": reason})
                number += 1
                continue
            if isinstance(image, (bytes, bytearray)):
                name = f"{number:09d}.img"
                (workdir / name).write_bytes(image)
                image, written = name, True
            rows.append(Row(image if isinstance(image, str) else "", -1, record, at))
            raw_labels.append(label)
            number += 1
    if not rows:
        detail = f" with an image ({len(skipped)} null in column {image_key!r})" if skipped else ""
        raise ImgpackError(f"{path}: the table has no rows{detail}")
    classes, labels = _classes(raw_labels)
    for row, label in zip(rows, labels):
        row.label = label
    image_root = workdir if written else base
    if written and any(not r.path for r in rows):
        raise ImgpackError(f"{path}: column {image_key!r} mixes image bytes with other values")
    extra = {"table": str(path.resolve())}
    return scan_rows(rows, image_root, classes, None, skipped, extra, where=str(path))


def _label_value(value: Any, at: str, column: str) -> Any:
    """A label cell as the class it names: a float that is a whole number as that int (pandas
    writes an int column with a null as floats: 10.0 must be class 10, not the text "10.0"),
    NaN as no label; a fraction is refused, it names no class."""
    if not isinstance(value, float):
        return value
    if math.isnan(value):
        return None
    if not value.is_integer():
        raise ImgpackError(
            f"{at}: column {column!r} holds {value!r}, which names no class (a label is an integer "
            "or a class name); pass --label-column with the column of classes"
        )
    return int(value)


def _classes(values: list[Any]) -> tuple[list[str], list[int]]:
    """Classes and each row's label: integers 0..max as given, names sorted; -1 where none."""
    present = [v for v in values if v is not None]
    if not present:
        return ["0"], [-1] * len(values)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        classes = implied_classes(present, len(values))  # a huge label is a skip, not that many names
        return classes, [v if v is not None and v >= 0 else -1 for v in values]
    names = sorted({str(v) for v in present})
    index = {n: i for i, n in enumerate(names)}
    return names, [index[str(v)] if v is not None else -1 for v in values]
