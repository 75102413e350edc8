"""The hashes of a part's kept samples, carried in its ``PartResult.extra`` (so the progress file
and Ray's plain-dict results keep them), and the sidecar the finished pack writes from them
(readers/store/sample_hashes.py has the format)."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import PartResult
from readers.store.manifest import write_atomic
from readers.store.sample_hashes import HASH_RECORD, HASHES_NAME, hashes_entry, pack_records

KEY = "hashes"  # PartResult.extra: base64 of the part's kept samples' hash records, in order


class PartHashes:
    def __init__(self) -> None:
        self.phashes: list[int] = []
        self.digests: list[bytes] = []

    def add(self, sample: PackedSample) -> None:
        self.phashes.append(sample.phash)
        self.digests.append(sample.digest or bytes(16))

    def to_extra(self) -> dict[str, str]:
        return {KEY: base64.b64encode(pack_records(self.phashes, self.digests)).decode("ascii")}


def part_records(result: PartResult) -> np.ndarray | None:
    """The hash records of a written part's kept samples; None for a part written before hashes
    were kept (resumed from an older pack's progress file)."""
    text = result.extra.get(KEY)
    if text is None:
        return None
    return np.frombuffer(base64.b64decode(text), dtype=HASH_RECORD)


def sidecar_bytes(results: Iterable[PartResult]) -> bytes | None:
    """Every part's records in dataset order; None when a part has none."""
    tables = [part_records(r) for r in results]
    if any(t is None for t in tables):
        return None
    return b"".join(t.tobytes() for t in tables if t is not None)


def write_sidecar(work: Path, results: list[PartResult], name: str = HASHES_NAME) -> dict[str, Any]:
    """Write the hash sidecar into the work folder; the manifest ``extra`` it adds ({} when a
    resumed old part has no hashes: the pack then has none, and `pack dups` hashes it on the fly)."""
    data = sidecar_bytes(results)
    if data is None:
        return {}
    write_atomic(work / name, data)
    return {"hashes": hashes_entry(data, name)}
