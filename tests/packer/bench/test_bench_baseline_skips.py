"""The bench baseline skips what the packer skipped, and says so."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import SAMPLE_DATA, run_cli


# -- the bench baseline skips what the packer skipped, and says so ----------------------------
def _source_with_a_truncated_jpeg(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA, src)
    victim = sorted((src / "animals").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return src, victim


def test_bench_baseline_skips_what_the_packer_skipped(tmp_path):
    src, victim = _source_with_a_truncated_jpeg(tmp_path)
    out = tmp_path / "ds"
    run_cli(
        "imagefolder", src, "--to", "lmdb", "-o", out, "--resize", "32", "--crop", "32", "--quiet", check=True
    )
    report = tmp_path / "bench.json"
    args = ("--workers", "0", "--epochs", "1", "--random-reads", "4", "--json", report, "--quiet")
    proc = run_cli("bench", out, "--baseline", src, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    relative = victim.relative_to(src).as_posix()
    assert f"the baseline skips the 1 file(s) that packing {out} skipped (first: {relative}" in proc.stdout
    counts = {d["name"]: d["num_samples"] for d in json.loads(report.read_text())["datasets"]}
    assert sorted(counts.values()) == [43, 43], counts


def test_bench_baseline_names_a_file_it_cannot_decode(tmp_path):
    from packer.bench.baseline import ImageFolderBaseline
    from readers.errors import DecodeError

    src, victim = _source_with_a_truncated_jpeg(tmp_path)
    baseline = ImageFolderBaseline(src, {"resize": 32, "crop": 32})
    index = [path for path, _ in baseline.samples].index(str(victim))
    with pytest.raises(DecodeError, match=re.escape(str(victim)) + ": the baseline cannot decode it"):
        baseline[index]
