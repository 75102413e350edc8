"""Small real filesystems for full-disk tests: a tmpfs mounted for a test, unmounted after it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str, readonly: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` ("16k", "20m") mounted at ``path`` (made here) for the block.

    CI runs as root, where this works: a refused mount fails the test, never skips it."""
    path.mkdir()
    options = f"size={size}" + (",ro" if readonly else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    assert proc.returncode == 0, f"cannot mount a tmpfs (root only, as CI): {proc.stderr.decode().strip()}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
