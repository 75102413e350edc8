"""The coverage-guided run of the window decoder (tests/support/fuzz_jpegwindow.py), time-boxed to 60 s
in CI: atheris + libFuzzer, the extension under ASan + UBSan with gcc block coverage, every input
through the differential check. The long run is the same command with ``--seconds 1800``
(docs/window-decoder.md has its result)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.jpeg_differential import ROOT

SECONDS = 60


@pytest.mark.slow
def test_a_minute_of_coverage_guided_fuzzing_finds_nothing(tmp_path):
    work = tmp_path / "fuzz"
    command = [sys.executable, "-m", "tests.support.fuzz_jpegwindow", "--seconds", str(SECONDS)]
    done = subprocess.run(
        [*command, "--work", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 200
    )
    log = (work / "fuzz.log").read_text(errors="replace") if (work / "fuzz.log").exists() else done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    assert done.returncode == 0 and summary.get("findings") == [], f"{summary}\n{log[-6000:]}"
    # The run really fuzzed, with coverage feedback from the C code (measured on the loaded
    # 2-core machine: ~1,000-2,000 executions/s; 72 blocks of csrc/jpegwindow.c reached within 20 s,
    # since csrc/restart_rows.c was removed: the corpus seeds alone reach ~69).
    assert summary["executions"] > 10_000, summary
    assert summary["coverage_blocks"] > 60, summary
