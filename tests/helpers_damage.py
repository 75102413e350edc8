"""Damaging a packed dataset on purpose, as the trust tests do: byte flips and manifest edits."""

from __future__ import annotations

import json
from pathlib import Path

from readers.manifest import SEAL_FIELD, seal_of


def edit_manifest(root: Path, change, reseal_manifest: bool = True) -> None:
    """Apply ``change`` to the manifest; by default also update its own checksum (a careful editor)."""
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    if reseal_manifest:
        data[SEAL_FIELD] = seal_of(data)
    path.write_text(json.dumps(data))


def flip_byte(path: Path, offset: int) -> None:
    """Invert the byte at ``offset``: same size, different bytes."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
