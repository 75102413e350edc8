"""The manifest's schema, checked before anything reads a field of it.

A manifest may be hand-edited, truncated or hostile, so every field is checked for its type and
range, the shard list for contiguity and sums, and shard file names for staying inside the
dataset. Errors name the field and say what was found, never a TypeError or MemoryError later.
What each part actually holds (LMDB entries, HDF5 lengths, index rows) is checked by the
format readers when they open it (``FormatReader.check_parts``).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

from readers.errors import ManifestError
from readers.store.paths import check_names

# Far above any real dataset, far below what would make a reader allocate or loop forever.
MAX_SAMPLES = 1 << 40
SHA256 = re.compile(r"[0-9a-f]{64}")


class _Oversized:
    """An integer of more digits than any manifest field can need, kept out of ``int()`` (which
    refuses more than 4,300 digits with a bare ValueError, and is slow well below that)."""


MAX_DIGITS = 30  # far above MAX_SAMPLES and 1 << 62


def _parse_int(text: str) -> int:
    return int(text) if len(text) <= MAX_DIGITS else _Oversized()  # type: ignore[return-value]


def _oversized_field(value: Any, field: str = "") -> str | None:
    if isinstance(value, _Oversized):
        return field or "(top level)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        name = f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}" if field else str(key)
        found = _oversized_field(item, name)
        if found:
            return found
    return None


def load_manifest_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` of a manifest whose integers are bounded: a number of more than MAX_DIGITS
    digits is a ManifestError naming its field (JSON syntax errors propagate as usual)."""
    data = json.loads(text, parse_int=_parse_int)
    field = _oversized_field(data)
    if field is not None:
        raise _fail(where, field, "is a number of more than 30 digits")
    return data


def _fail(where: str, field: str, problem: str) -> ManifestError:
    return ManifestError(f"{where}: field {field!r} {problem}; the manifest is corrupt, re-pack the dataset")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(data: dict, key: str, where: str, field: str, low: int = 0, high: int = MAX_SAMPLES) -> int:
    value = data.get(key)
    if not _is_int(value):
        raise _fail(where, field, f"must be an integer, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise _fail(where, field, f"is {value}, outside {low}..{high}")
    return value


def _typed(data: dict, key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise _fail(where, key, f"must be a {kind.__name__}, got {type(value).__name__}")
    return value


def check_schema(data: dict[str, Any], where: str, encodings: tuple[str, ...], newest: int) -> None:
    """Raise ManifestError naming the first field of ``data`` that is missing or malformed."""
    required = ("format", "format_version", "num_samples", "classes", "encoding", "preprocess", "shards")
    missing = [k for k in required if k not in data]
    if missing:
        raise ManifestError(f"{where}: missing field(s) {', '.join(missing)}; re-pack the dataset")
    _typed(data, "format", str, where)
    version = data["format_version"]
    if not _is_int(version) or version < 1:
        raise _fail(where, "format_version", f"must be a positive integer, got {version!r}")
    if version > newest:
        raise ManifestError(
            f"{where}: format_version {version!r} is newer than this imgpack supports "
            f"({newest}); upgrade imgpack (pip install -U imgpack)"
        )
    num_samples = _int(data, "num_samples", where, "num_samples")
    classes = _typed(data, "classes", list, where)
    bad = next((c for c in classes if not isinstance(c, str)), None)
    if bad is not None:
        raise _fail(where, "classes", f"must be a list of strings, holds {bad!r}")
    if len(set(classes)) != len(classes):
        raise _fail(where, "classes", "lists a class name twice")
    if num_samples and not classes:
        raise _fail(where, "classes", f"is empty but there are {num_samples} samples")
    if data["encoding"] not in encodings:
        raise _fail(where, "encoding", f"is {data['encoding']!r}, not one of {', '.join(encodings)}")
    _typed(data, "preprocess", dict, where)
    for key, kind in (("skipped", list), ("extra", dict)):
        if key in data:
            _typed(data, key, kind, where)
    if data.get("stored_sizes") is not None:
        sizes = _typed(data, "stored_sizes", dict, where)
        for key in sizes:
            _int(sizes, key, where, f"stored_sizes.{key}")
    _check_shards(_typed(data, "shards", list, where), num_samples, where)


def _check_shards(shards: list, num_samples: int, where: str) -> None:
    total = 0
    for i, shard in enumerate(shards):
        field = f"shards[{i}]"
        if not isinstance(shard, dict):
            raise _fail(where, field, f"must be an object, got {type(shard).__name__}")
        unknown = sorted(set(shard) - {"file", "first", "count", "bytes", "sha256"})
        if unknown:
            raise _fail(where, field, f"has unknown key(s) {', '.join(unknown)}")
        first = _int(shard, "first", where, f"{field}.first")
        count = _int(shard, "count", where, f"{field}.count")
        size = _int(shard, "bytes", where, f"{field}.bytes", high=1 << 62)
        if count > size:  # every sample takes at least one byte of its part
            raise _fail(where, f"{field}.count", f"is {count}, more samples than the part's {size} bytes")
        if first != total:
            raise _fail(where, f"{field}.first", f"is {first}, expected {total} (shards must be contiguous)")
        sha = shard.get("sha256")
        if not isinstance(sha, str) or not SHA256.fullmatch(sha):
            raise _fail(where, f"{field}.sha256", f"must be 64 lowercase hex digits, got {sha!r}")
        if not isinstance(shard.get("file"), str):
            raise _fail(where, f"{field}.file", f"must be a string, got {shard.get('file')!r}")
        total += count
    check_names([s["file"] for s in shards], where, "shard file")
    if total != num_samples:
        raise _fail(where, "num_samples", f"is {num_samples} but the shards hold {total} samples")
