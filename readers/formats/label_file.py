"""Every sample's label as one file of little-endian int64s beside the shards (tar, tfrecord).

Those formats keep the label inside each sample (``.cls``/``.json`` members, the Example), so
``labels()`` would have to read every sample; the writer also stores them together here. One
file, not ``[label, count]`` runs in manifest.json: a shuffled pack has one run per sample, ~40
bytes of indented JSON each, parsed on every open; this file is 8 bytes a sample, read on first need in
one read. The manifest's ``extra.labels`` records its name, size and sha256 (sealed with it).
"""

from __future__ import annotations

from typing import Any

from readers.errors import ManifestError
from readers.store.checksums import sha256_of_bytes

LABELS_NAME = "labels.i64"
LABELS_DTYPE = "<i8"
ITEM = 8


def labels_entry(data: bytes) -> dict[str, Any]:
    """The manifest's ``extra.labels`` entry for a label file holding ``data``."""
    return {"file": LABELS_NAME, "dtype": LABELS_DTYPE, "bytes": len(data), "sha256": sha256_of_bytes(data)}


def parse_entry(entry: Any, samples: int, where: str) -> tuple[str, int, str]:
    """(file, bytes, sha256) of a manifest ``extra.labels`` entry, checked against ``samples``."""
    try:
        name, size, sha = entry["file"], entry["bytes"], entry["sha256"]
        ok = entry.get("dtype", LABELS_DTYPE) == LABELS_DTYPE
        ok = ok and isinstance(name, str) and type(size) is int and isinstance(sha, str)
    except (TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise ManifestError(f"{where} is not a {{file, dtype: {LABELS_DTYPE}, bytes, sha256}} entry; re-pack")
    if size != samples * ITEM:
        raise ManifestError(f"{where} says {size} bytes, not {ITEM} for each of {samples} samples; re-pack")
    return name, size, sha
