"""Packing memory does not grow with the source: the scan at 200k files against 20k (issue 15).

A list of ``SourceItem`` objects grew ~400 bytes per file (~70 MiB from 20k to 200k files); the
compact table kept in memory would grow ~55; the scan writes it to a mapped temporary file and
grows ~7. Measured in fresh processes (peak RSS over the process after its imports), on real
empty files: a bound on memory, not a timing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from packer.bench.suites.scan_memory import build_tree, measure
from tests.conftest import REPO

SMALL, LARGE = 20_000, 200_000
BYTES_PER_FILE = 40  # the bound on growth per extra file


def test_scan_memory_growth_is_bounded(tmp_path: Path) -> None:
    # 200k empty files: a few seconds on tmpfs, several times that on a journaling disk
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    growth = {}
    try:
        for n in (SMALL, LARGE):
            build_tree(work / str(n), n)
            row = measure(REPO, "scan", work / str(n))
            assert row["count"] == n
            growth[n] = row["peak_growth_mib"] * 2**20
            shutil.rmtree(work / str(n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_file = (growth[LARGE] - growth[SMALL]) / (LARGE - SMALL)
    assert per_file < BYTES_PER_FILE, f"scan grew {per_file:.0f} B per extra file (bound {BYTES_PER_FILE})"
