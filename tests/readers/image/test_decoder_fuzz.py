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


def test_the_reference_header_reader_reads_markers_as_libjpeg_does():
    """A fuzzer finding (CI, 2026-12-07): an APP0 segment of length 0 before the tables, which
    libjpeg (the window decoder, simplejpeg, Pillow) reads past; the harness's header reader did
    not, and flagged the decoder's correct image size as a difference."""
    from readers.image import jpegwindow
    from readers.image.decode import jpeg_size as product_size
    from tests.support.jpeg_corpus import jpeg_size, seeds, window_params
    from tests.support.jpeg_differential import check_window

    name, whole = next((n, d) for n, d in sorted(seeds().items()) if n == "411-64x48")
    size = jpeg_size(whole)
    damaged = {
        "empty APP0": whole[:2] + b"\xff\xe0\x00\x00" + whole[2:],
        "bytes before a marker": whole[:2] + b"\x00\x17" + whole[2:],
        "FF 00 before a marker": whole[:2] + b"\xff\x00" + whole[2:],
    }
    assert product_size(damaged["empty APP0"]) == size  # simplejpeg reads past it too
    outcomes = {}
    for kind, data in damaged.items():
        assert jpeg_size(data) == size, (name, kind)
        outcome, problems = check_window(jpegwindow.DECODER, data, window_params(bytes(6), size))
        assert problems == [], (name, kind, outcome, problems)
        outcomes[kind] = outcome
    assert outcomes["empty APP0"] == "decoded"  # the finding: decoded at the header's size
    assert jpeg_size(whole[:2] + b"\xff\xe0\x00") is None  # cut inside a length field
