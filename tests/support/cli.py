"""Helpers for tests of the `pack` CLI: a small pack of sample_data, one-line failures, tiny sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tests.conftest import SAMPLE_DATA, run_cli


def pack_sample(out: Path, fmt: str, *extra) -> None:
    """sample_data packed into ``out`` as ``fmt`` (resize 24, three parts), through the CLI."""
    run_cli("imagefolder", SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--shards", "3",
            "--workers", "1", "-q", *extra, check=True)


def assert_one_line(proc, *needles: str, rc: int = 1) -> str:
    """A CLI run that failed with one line naming ``needles`` (no traceback)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == rc, text
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


def write_images(folder, names, size=(8, 8)):
    """Small solid-colour images named ``names`` in ``folder`` (created); the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((*size, 3), 40 * i % 250, np.uint8)).save(folder / name)
    return folder
