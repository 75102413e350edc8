"""Coverage-guided fuzzing of the JPEG window decoder (csrc/) with atheris, for a bounded time.

    python -m tests.support.fuzz_jpegwindow --seconds 1800 --work fuzz-work
    python -m tests.support.fuzz_jpegwindow --work fuzz-work --reproduce fuzz-work/crash-...   # one input

Builds the extension into ``--work`` with AddressSanitizer + UBSan and gcc's basic-block coverage
(csrc/fuzz/coverage.c hands the counters to atheris's libFuzzer), restarts itself with libasan
preloaded, and lets libFuzzer mutate inputs from the seed corpus (tests/support/jpeg_corpus.py): each
input is 6 bytes that choose the window, scale, colour space and IDCT, then a
JPEG. Every input goes through the differential check (tests/support/jpeg_differential.py: the window
equals whole rows + crop and Pillow's whole decode + crop, no write past the buffer); a problem
raises, and libFuzzer saves the input as ``--work/crash-*``. The last line printed is a JSON
summary (executions, coverage, findings). tests/readers/image/test_decoder_fuzz.py runs it for 60 s in CI.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.support.jpeg_corpus import jpeg_size, seeds, window_params
from tests.support.jpeg_differential import (
    ROOT,
    SANITIZER_FLAGS,
    build_extension,
    gcc_runtime,
    install_extension,
)
from tests.support.jpeg_variants import build_tool, variants

SLOTS = 65536  # csrc/fuzz/coverage.c's IMGPACK_COV_SLOTS


def build(work: Path) -> Path:
    coverage = work / "coverage.o"
    flags = ["-O1", "-g", "-fPIC", "-c", str(ROOT / "csrc" / "fuzz" / "coverage.c"), "-o", str(coverage)]
    subprocess.run(["gcc", *flags], check=True)
    return build_extension(work / "build", [*SANITIZER_FLAGS, "-fsanitize-coverage=trace-pc"], [coverage])


def register_coverage(so: Path) -> None:
    """Hand the extension's block counters to the libFuzzer inside atheris, loaded here first
    (atheris imports the same file later and gets this copy). Loaded locally: with its symbols
    global, atheris would take it for a preloaded libFuzzer and drive it through its other core."""
    import atheris

    core_name = "core_with_libfuzzer" + sysconfig.get_config_var("EXT_SUFFIX")
    core = ctypes.CDLL(os.path.join(os.path.dirname(atheris.__file__), core_name), mode=ctypes.RTLD_LOCAL)
    extension = ctypes.CDLL(str(so))
    counters = ctypes.addressof(ctypes.c_ubyte.in_dll(extension, "imgpack_cov_counters"))
    pcs = ctypes.addressof(ctypes.c_size_t.in_dll(extension, "imgpack_cov_pcs"))
    table = (ctypes.c_size_t * (2 * SLOTS)).from_address(pcs)
    for slot in range(SLOTS):  # distinct placeholders until a block's real address is seen
        table[2 * slot] = slot + 1
    core.__sanitizer_cov_8bit_counters_init(ctypes.c_void_p(counters), ctypes.c_void_p(counters + SLOTS))
    pcs_end = pcs + 2 * SLOTS * ctypes.sizeof(ctypes.c_size_t)
    core.__sanitizer_cov_pcs_init(ctypes.c_void_p(pcs), ctypes.c_void_p(pcs_end))


def write_seeds(work: Path) -> None:
    """The seed corpus: tests/support/jpeg_corpus.py's files and the arithmetic and 12-bit variants."""
    from readers.image import jpegwindow  # the normal build, in this (parent) process only

    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    files = {**seeds(), **variants(build_tool(work / "tool"), jpegwindow.LIBRARY or "libjpeg.so.62")}
    for i, (name, data) in enumerate(sorted(files.items())):
        prefix = bytes([(i * 37) % 256, (i * 91) % 256, 128 + i % 128, 96 + i % 160, i % 8, i % 8])
        (corpus / f"{name}.in").write_bytes(prefix + data)


def fuzz(args: argparse.Namespace) -> None:
    """Runs in the restarted process (libasan preloaded)."""
    import atheris

    from tests.support.jpeg_differential import check_window

    so = Path(args.so)
    register_coverage(so)
    decoder = install_extension(so).DECODER
    assert decoder is not None, "the instrumented build found no libjpeg-turbo"

    def one_input(raw: bytes) -> None:
        data = raw[6:]
        params = window_params(raw[:6], jpeg_size(data))
        outcome, problems = check_window(decoder, data, params)
        if problems:
            raise AssertionError(f"{params} {outcome}: {problems}")

    work = Path(args.work)
    libfuzzer = [
        f"-max_total_time={args.seconds}", "-max_len=131072", "-timeout=20", "-rss_limit_mb=3072",
        "-print_final_stats=1", f"-artifact_prefix={work}/", "-reload=0",
    ]
    inputs = args.reproduce or [str(work / "corpus")]  # given files: run just those, once each
    atheris.Setup([sys.argv[0], *libfuzzer, *inputs], one_input)
    atheris.Fuzz()


def summary(log: str, returncode: int, work: Path) -> dict:
    """Executions, coverage and findings from libFuzzer's log."""
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", log, re.M))
    coverage = re.findall(r"cov: (\d+) ft: (\d+)", log)
    return {
        "returncode": returncode,
        "executions": int(stats.get("number_of_executed_units", 0)),
        "executions_per_second": int(stats.get("average_exec_per_sec", 0)),
        "coverage_blocks": int(coverage[-1][0]) if coverage else 0,
        "features": int(coverage[-1][1]) if coverage else 0,
        "corpus_files": len(list((work / "corpus").iterdir())),
        "findings": sorted(p.name for p in work.iterdir() if re.match(r"(crash|leak|timeout|oom)-", p.name)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--work", default="fuzz-work", help="build, corpus and crash inputs go here")
    parser.add_argument("--reproduce", nargs="+", help="run these saved inputs (crash-*) and stop")
    parser.add_argument("--so", help=argparse.SUPPRESS)  # set when it restarts itself
    args = parser.parse_args()
    if args.so:
        fuzz(args)
        return
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    so = build(work)
    write_seeds(work)
    # libstdc++ preloaded too: ASan resolves the real __cxa_throw (atheris's C++ core throws) at start.
    preload = [gcc_runtime("libasan.so"), gcc_runtime("libstdc++.so.6")]
    env = {
        **os.environ,
        "LD_PRELOAD": " ".join(preload),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "tests.support.fuzz_jpegwindow", "--seconds", str(args.seconds)]
    command += ["--work", str(work)]
    command += ["--so", str(so)]
    if args.reproduce:
        command += ["--reproduce", *map(os.path.abspath, args.reproduce)]
    with open(work / "fuzz.log", "w") as log:
        done = subprocess.run(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    print(json.dumps(summary((work / "fuzz.log").read_text(errors="replace"), done.returncode, work)))
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
