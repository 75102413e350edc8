"""The pack every contract test reads, and the small helpers the contract's parts share."""

from __future__ import annotations

import shutil
from pathlib import Path

from readers.formats import format_named, open_reader

SPLIT = {"samples_per_shard": 20}  # 44 samples: shards of 20, 20, 4 (uneven: the last is short)
LOSSLESS = {"resize": 40, "crop": 32, "encode": "png"}
SAMPLES = 44


def spec_for(fmt: str) -> dict:
    """LOSSLESS, in the format's own encoding where it stores one only (bmp)."""
    encodings = format_named(fmt).encodings
    return {**LOSSLESS, "encode": "png" if "png" in encodings else encodings[0]}


def copy_of(path: Path, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(path, root, symlinks=True)
    return root


def stored(path: str | Path, **options) -> list[tuple[bytes, int]]:
    reader = open_reader(path, **options)
    return [(bytes(r.data), r.label) for r in reader.read_block(0, len(reader))]
