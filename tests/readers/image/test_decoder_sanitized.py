"""The window decoder built with AddressSanitizer + UBSan, replaying ~1,700 generated and damaged
JPEGs with the differential check (tests/support/jpeg_differential.py) in a child process that preloads
gcc's libasan: every run of the suite, about a minute.

The corpus: tests/support/jpeg_corpus.py's seeds (every sampling, progressive cut after 1..n scans,
restart markers, grey, CMYK, 1x1 to 190x257), tests/support/jpeg_variants.py's arithmetic-coded and 12-bit
files, and 1,500 deterministic mutants of them (truncations, bit flips, bad markers, odd sampling
factors, frame sizes, segment lengths, restart markers, frame types). A crash names the file it
was decoding and leaves it in the test's findings folder; a pixel difference does the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from readers.image import jpegwindow
from tests.support.jpeg_corpus import mutants, seeds
from tests.support.jpeg_differential import ROOT, SANITIZER_FLAGS, build_extension, gcc_runtime
from tests.support.jpeg_variants import build_tool, variants

MUTANTS = 1500


def write_corpus(folder: Path, tool_dir: Path) -> int:
    folder.mkdir()
    files = {**seeds(), **variants(build_tool(tool_dir), jpegwindow.LIBRARY)}
    files.update(mutants(files, MUTANTS))
    for name, data in files.items():
        (folder / f"{name}.jpg").write_bytes(data)
    return len(files)


def test_the_sanitized_decoder_matches_a_whole_decode_on_every_corpus_file(tmp_path):
    assert jpegwindow.LIBRARY is not None  # the library the replay must load too
    so = build_extension(tmp_path / "asan", SANITIZER_FLAGS)
    count = write_corpus(tmp_path / "corpus", tmp_path / "tool")
    findings = tmp_path / "findings"
    env = {
        **os.environ,
        "LD_PRELOAD": gcc_runtime("libasan.so"),
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "PYTHONPATH": str(ROOT),
    }
    corpus = tmp_path / "corpus"
    command = [sys.executable, "-m", "tests.support.jpeg_differential", str(so), str(corpus), str(findings)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    current = findings / "current"
    if done.returncode != 0:
        name = current.read_text() if current.exists() else "(before the first file)"
        crashed = corpus / name
        raise AssertionError(f"the sanitized replay died on {crashed}:\n{done.stderr[-6000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["sanitizers"] == ["libasan", "libubsan"]
    assert summary["library"] == jpegwindow.LIBRARY  # the libjpeg-turbo the readers use
    assert summary["files"] == count
    assert summary["problems"] == [], f"saved in {findings}:\n" + "\n".join(summary["problems"][:20])
    outcomes = summary["outcomes"]
    # Both sides exercised (measured: 426 windows checked against Pillow, 895 against whole rows
    # only, 3,911 refused).
    assert outcomes.get("checked-pillow", 0) > 300 and outcomes.get("decoded", 0) > 600, outcomes
    assert outcomes.get("refused", 0) > 1000, outcomes
