"""Per-sample fields beyond the label: their kinds, the schema, and the one canonical encoding.

A schema is ``{name: kind}`` (recorded in the manifest as ``fields``, with per-field fill counts).
Kinds: "int", "float", "str", "ints" / "floats" (lists of numbers), "json" (any JSON value),
"boxes" (float32 (N, 4), COCO x, y, width, height in pixels of the stored image) and "box_ints"
(int64 (N,), one per box of the sample's "boxes" field, filtered with them when a crop drops boxes).

Numbers keep their stored precision on every path: "int"/"ints" are int64 (an integer outside
int64 is refused at pack time, a skip naming the row), "float"/"floats" float64, never rounded to
float32 (only boxes are float32, in pixels). NaN and infinity are refused in every number field,
and a JSON value nested deeper than ``MAX_DEPTH`` is refused: parsing it again would overflow
Python's stack in the reader.

Values travel as plain Python / NumPy: ``normalise`` checks one row's values against the schema
(a ``FieldError`` names what is wrong: a skip for the source), ``encode`` turns a sample's fields
into canonical UTF-8 JSON (never pickle) and ``decode`` turns it back, boxes and number lists as
arrays. Formats that store fields in their own idiom (tar members, TFRecord features) still use
``normalise``/``decode`` for the values. This module is a leaf.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from readers.errors import ImgpackError

KINDS = ("int", "float", "str", "ints", "floats", "json", "boxes", "box_ints")
Schema = dict[str, str]
# Names a field may not take: the label rides in the target already; "geometry" is the applied
# crop window and flip, added at read time on request.
RESERVED = ("label", "geometry")
INT64 = (-(2**63), 2**63 - 1)
MAX_DEPTH = 100  # JSON nesting a field may have (lists/objects inside each other)


class FieldError(ImgpackError, ValueError):
    """A field value that does not fit its kind (the row is skipped with this reason)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    """The kind a single value suggests (lists of numbers are "ints"/"floats", else "json")."""
    if isinstance(value, bool):
        return "json"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)) and all(_is_number(v) for v in value):
        # an empty list is "ints": it widens to "floats" or "json" with the column's other rows
        return "ints" if all(isinstance(v, int) for v in value) else "floats"
    return "json"


# A field seen with two kinds is widened to the first kind here that holds both.
_WIDER = {
    frozenset({"int", "float"}): "float",
    frozenset({"ints", "floats"}): "floats",
}


def widen(a: str, b: str) -> str | None:
    """The kind holding values of kinds ``a`` and ``b`` (None: they do not mix)."""
    if a == b:
        return a
    wider = _WIDER.get(frozenset({a, b}))
    if wider is not None:
        return wider
    if "json" in (a, b) and "str" not in (a, b):
        return "json"  # numbers, lists and objects are all JSON values
    return None


def infer_schema(rows: Iterable[Mapping[str, Any]]) -> tuple[Schema, dict[str, str]]:
    """(schema, conflicts) inferred from the rows' values (None values ignored); ``conflicts``
    names the fields whose kinds do not mix (a string, then a number) with the two kinds."""
    schema: Schema = {}
    conflicts: dict[str, str] = {}
    for row in rows:
        for name, value in row.items():
            if value is None or name in conflicts:
                continue
            kind = kind_of(value)
            seen = schema.get(name)
            if seen is None:
                schema[name] = kind
                continue
            wider = widen(seen, kind)
            if wider is None:
                conflicts[name] = f"{seen} and {kind}"
            else:
                schema[name] = wider
    return schema, conflicts


def check_schema(schema: Mapping[str, str], where: str) -> Schema:
    """``schema`` as a plain dict, every name and kind checked (an ImgpackError naming ``where``)."""
    out: Schema = {}
    for name, kind in schema.items():
        if not isinstance(name, str) or not name or name in RESERVED:
            raise ImgpackError(f"{where}: field name {name!r} is empty or reserved ({', '.join(RESERVED)})")
        if kind not in KINDS:
            raise ImgpackError(
                f"{where}: field {name!r} has unknown kind {kind!r}; kinds: {', '.join(KINDS)}"
            )
        out[name] = kind
    if "box_ints" in out.values() and "boxes" not in out.values():
        raise ImgpackError(f"{where}: a box_ints field needs a boxes field (one value per box)")
    return out


def _beyond_int64(name: str, value: Any) -> FieldError:
    return FieldError(
        f"field {name!r}: {_short(value)} does not fit int64 (integer fields are int64); "
        "store such an id as text (a JSON string)"
    )


def _number_list(name: str, value: Any, integer: bool) -> np.ndarray:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise FieldError(f"field {name!r}: {_short(value)} is not a list of numbers")
    if integer and any(isinstance(v, int) and not INT64[0] <= v <= INT64[1] for v in value):
        raise _beyond_int64(name, value)
    try:
        array = np.asarray(value, dtype=np.int64 if integer else np.float64)
    except (TypeError, ValueError, OverflowError):
        raise FieldError(f"field {name!r}: {_short(value)} is not a list of numbers") from None
    if array.ndim != 1:
        raise FieldError(f"field {name!r}: {_short(value)} is not a flat list of numbers")
    if integer and isinstance(value, (list, tuple)) and any(isinstance(v, float) for v in value):
        raise FieldError(f"field {name!r}: {_short(value)} holds non-integers")
    if not integer and not np.isfinite(array).all():
        raise FieldError(f"field {name!r}: {_short(value)} holds NaN or an infinity")
    return array


def _short(value: Any, limit: int = 40) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def normalise_value(name: str, kind: str, value: Any) -> Any:
    """``value`` checked against ``kind``: int, float, str, a list (ints/floats/box_ints), a list
    of [x, y, w, h] (boxes) or a JSON value; a ``FieldError`` says what does not fit."""
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise FieldError(f"field {name!r}: {_short(value)} is not an integer")
        if not INT64[0] <= int(value) <= INT64[1]:
            raise _beyond_int64(name, value)
        return int(value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise FieldError(f"field {name!r}: {_short(value)} is not a number")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            raise FieldError(f"field {name!r}: {_short(value)} is beyond the float64 range") from None
        if not math.isfinite(number):
            raise FieldError(f"field {name!r}: {value} is not a finite number")
        return number
    if kind == "str":
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise FieldError(f"field {name!r}: not valid UTF-8 text") from None
        if not isinstance(value, str):
            raise FieldError(f"field {name!r}: {_short(value)} is not text")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from a mis-decoded source
            raise FieldError(f"field {name!r}: not valid UTF-8 text") from None
        return value
    if kind in ("ints", "box_ints"):
        return _number_list(name, value, integer=True).tolist()
    if kind == "floats":
        array = _number_list(name, value, integer=False)
        return array.tolist()
    if kind == "boxes":
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise FieldError(f"field {name!r}: {_short(value)} is not a list of [x, y, w, h] boxes") from None
        if array.size == 0:
            return []
        if array.ndim != 2 or array.shape[1] != 4:
            raise FieldError(f"field {name!r}: {_short(value)} is not a list of [x, y, w, h] boxes")
        if not np.isfinite(array).all():
            raise FieldError(f"field {name!r}: a box coordinate is NaN or infinite")
        return array.tolist()
    # json: must round-trip through JSON (no NaN, no objects JSON cannot hold)
    if json_depth(value) > MAX_DEPTH:
        raise FieldError(f"field {name!r}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise FieldError(f"field {name!r}: not a JSON value ({exc})") from None


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar: 0), without recursion: the
    value may be nested deeper than Python's stack allows."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(data: str | bytes) -> Any:
    """``json.loads`` whose nesting too deep for the parser is a ``ValueError`` like any other
    malformed JSON (Python raises ``RecursionError`` at about 1,000 levels)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply (over about 1,000 levels)") from None


def normalise(schema: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """One sample's fields checked against ``schema`` (missing or None values are left out);
    "box_ints" must count as many values as the sample has boxes."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        kind = schema.get(name)
        if kind is None or value is None:
            continue
        out[name] = normalise_value(name, kind, value)
    boxes = [n for n, k in schema.items() if k == "boxes"]
    count = len(out[boxes[0]]) if boxes and boxes[0] in out else 0
    for name, kind in schema.items():
        if kind == "box_ints" and name in out and len(out[name]) != count:
            raise FieldError(f"field {name!r}: {len(out[name])} values for {count} boxes")
    return out


def encode(values: Mapping[str, Any]) -> bytes:
    """Normalised fields as canonical UTF-8 JSON (sorted keys, no spaces): the stored bytes."""
    return json.dumps(
        values, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
    ).encode()


def typed(schema: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Stored values as the readers hand them out: boxes float32 (N, 4), box_ints/ints int64 and
    floats float64 arrays; the rest as they are. Every schema field is present (None if unset;
    boxes and box_ints: empty arrays)."""
    out: dict[str, Any] = {}
    for name, kind in schema.items():
        value = values.get(name)
        if kind == "boxes":
            out[name] = np.asarray(value if value is not None else [], dtype=np.float32).reshape(-1, 4)
        elif kind in ("box_ints", "ints"):
            out[name] = np.asarray(value if value is not None else [], dtype=np.int64).reshape(-1)
        elif kind == "floats":
            out[name] = None if value is None else np.asarray(value, dtype=np.float64).reshape(-1)
        else:
            out[name] = value
    return out


def decode(
    schema: Mapping[str, str], data: bytes | bytearray | memoryview, where: str = ""
) -> dict[str, Any]:
    """Stored JSON fields back as ``typed`` values; a broken document is a ChecksumError-like
    ImgpackError naming ``where``."""
    try:
        values = parse_json(bytes(data)) if len(data) else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise ImgpackError(f"{where}: stored fields are not JSON ({exc}); the dataset is corrupt") from None
    if not isinstance(values, dict):
        raise ImgpackError(f"{where}: stored fields are not a JSON object; the dataset is corrupt")
    return typed(schema, values)


def fill_counts(schema: Mapping[str, str], counts: dict[str, int], values: Mapping[str, Any]) -> None:
    """Count in ``counts`` the fields ``values`` sets (for the manifest's fill rates)."""
    for name in values:
        if name in schema:
            counts[name] = counts.get(name, 0) + 1


def select(schema: Mapping[str, str], wanted: Iterable[str], where: str) -> tuple[str, ...]:
    """The requested field names, each checked present in ``schema`` ("geometry" always is)."""
    names = tuple(wanted)
    missing = [n for n in names if n not in schema and n != "geometry"]
    if missing:
        have = ", ".join(schema) or "none"
        raise ImgpackError(f"{where}: no field {', '.join(map(repr, missing))} (fields stored: {have})")
    return names


def target(
    label: int, stored: Any, names: Sequence[str], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A sample's target with fields: ``{"label": label, name: value...}`` for ``names`` (values
    from the record's typed ``stored`` fields, or ``extra`` such as the applied "geometry")."""
    out: dict[str, Any] = {"label": label}
    values = stored if isinstance(stored, Mapping) else {}
    for name in names:
        out[name] = extra[name] if extra is not None and name in extra else values.get(name)
    return out


class Ragged:
    """A batch's variable-length per-sample arrays as one array of rows plus the rows of each
    sample: one buffer to pickle from a worker instead of one per sample (each costs several
    microseconds on both sides); ``as_tensors`` hands the user the per-sample list of tensors."""

    __slots__ = ("rows", "counts")

    def __init__(self, rows: np.ndarray, counts: np.ndarray) -> None:
        self.rows = rows  # (sum(counts), ...) in sample order
        self.counts = counts  # (B,) int64

    def __reduce__(self) -> tuple[Any, ...]:
        return Ragged, (self.rows, self.counts)

    def arrays(self) -> list[np.ndarray]:
        """One array per sample (views of ``rows``)."""
        return np.split(self.rows, np.cumsum(self.counts)[:-1]) if len(self.counts) else []


def as_tensors(values: dict[str, Any]) -> dict[str, Any]:
    """Collated fields with NumPy arrays (alone, in lists or ``Ragged``) as torch tensors, in place."""
    import torch

    for name, value in values.items():
        if isinstance(value, Ragged):
            values[name] = list(torch.from_numpy(value.rows).split(value.counts.tolist()))
        elif isinstance(value, np.ndarray):
            values[name] = torch.from_numpy(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            values[name] = [torch.from_numpy(v) for v in value]
    return values
