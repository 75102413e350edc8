"""The docs' code runs: every fenced block of README.md and of each docs/*.md page, in order, against
sample_data (issue 17).

Each page runs on its own, as a reader following it would: its own scratch directory and one Python
namespace for its ``python`` blocks (a later block may use an earlier one's names, never another
page's). A failure names the page and the line of the block.

How a block is treated:
- ``python`` blocks run in the page's namespace; ``bash``/``sh`` and unlabelled blocks run with
  bash, ``pack`` and ``python`` being this checkout's;
- ``text`` blocks are program output, not code;
- a marker comment on the line right above a block changes that:
  ``<!-- readme-test: not run: REASON -->`` (a GPU, S3, installing packages: the reason is
  required and printed), ``<!-- readme-test: first run: COMMAND -->`` (a shell command that makes
  what the block reads, e.g. a dataset another page packs), ``<!-- readme-test: given: PYTHON -->``
  (names a fragment leaves to the reader, e.g. a count) and
  ``<!-- readme-test: same as: PAGE -->`` (the block is a copy of part of a block that runs on
  PAGE, e.g. a benchmark the README quotes: checked to be one, not run twice).

Everything runs in a scratch directory holding ``sample_data`` and ``scripts`` (links into this
checkout), with the user's data swapped for sample_data and the sizes scaled down (SUBSTITUTIONS:
44 images instead of ImageNet, 2 epochs instead of 90, 2 workers), so the docs cannot drift from
the code without this test failing. Benchmark reproductions run as tests of their own.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cli_env
from tests.support.markdown import REPO, doc_pages, fences, page_name

MARKER = re.compile(r"<!--\s*readme-test:\s*(not run|first run|given|same as):\s*(.*?)\s*-->")
SHELL = ("", "bash", "sh", "shell", "console")
SUBSTITUTIONS = [
    (r"~/data/(imagenet/)?train", "sample_data"),
    (r"--workers 8\b", "--workers 2"),
    (r"num_workers=[48]\b", "num_workers=2"),
    (r"range\((\w+, )?90\)", r"range(\g<1>2)"),
    (r"--n 2000\b", "--n 24"),
    (r"/tmp/imgpack-bench", "imgpack-bench"),
    (r"--workers 0,2(,4)?\b", "--workers 0"),
    (r"--epochs [23]\b", "--epochs 1"),
    (r"--sizes 1000,10000,100000", "--sizes 16"),
    (r"--samples 100000 1000000", "--samples 2000"),
    (r"--sizes 20000 200000 1000000", "--sizes 300"),
    (r"--samples 1000000 --per-part 100000", "--samples 2000 --per-part 1000"),
    (r"--seconds 1800\b", "--seconds 2"),
    (r"--n 4000 --rounds 3 --delays 0,30", "--n 48 --rounds 1 --delays 0,30"),
    (
        r"--samples 100000,1280000 --formats lmdb,hdf5 --ranks 16 --resume-ranks 12 --workers 2",
        "--samples 1000 --formats lmdb --ranks 2 --resume-ranks 1 --workers 1 --workdir many-ranks",
    ),
]


@dataclass
class Block:
    page: str  # README.md or docs/NAME.md
    line: int  # 1-based line of the opening fence in the page
    lang: str
    code: str
    marker: tuple[str, str] | None

    @property
    def runnable(self) -> bool:
        return self.lang != "text" and not (self.marker and self.marker[0] in ("not run", "same as"))

    @property
    def copied(self) -> bool:
        return bool(self.marker and self.marker[0] == "same as")

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(text: str, page: str) -> list[Block]:
    lines = text.splitlines()
    blocks = []
    for start, end, lang in fences(lines, page):
        found = MARKER.search(lines[start - 1]) if start else None
        marker = (found.group(1), found.group(2)) if found else None
        blocks.append(Block(page, start + 1, lang, "\n".join(lines[start + 1 : end]) + "\n", marker))
    return blocks


@functools.cache
def blocks_of(page: str) -> list[Block]:
    return page_blocks((REPO / page).read_text(encoding="utf-8"), page)


PAGES = [page_name(path) for path in doc_pages()]


def scaled_down(code: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        code = re.sub(pattern, replacement, code)
    return code


def test_every_block_is_run_or_says_why_not():
    blocks = [block for page in PAGES for block in blocks_of(page)]
    tour = [b for b in blocks if b.page == "README.md" and (b.runnable or b.copied)]
    assert len(tour) >= 3  # the quick tour runs, here or as a checked copy of a page's block
    for block in blocks:
        assert block.lang in ("python", "text", *SHELL), f"{block.where}: unknown block language"
        kind, value = block.marker or ("", "")
        if kind == "not run":
            assert len(value) > 10, f"{block.where}: say why the block cannot run"
        if kind == "same as":
            assert value in PAGES, f"{block.where}: 'same as' names {value!r}, not a page of the docs"
            copied = block.code.strip()
            assert any(copied in other.code for other in blocks_of(value) if other.runnable), (
                f"{block.where}: no block that runs on {value} holds this one"
            )
    skipped = [b for b in blocks if b.marker and b.marker[0] == "not run"]
    # most of the docs run; the fifth: torchvision's models, which CI cannot install (docs/detection.md)
    assert len(skipped) <= 5, [(b.where, b.marker) for b in skipped]
    assert sum(b.lang == "python" and b.runnable for b in blocks) >= 5


# `pack bench` and its suites, not the data makers a page's later blocks read from
BENCH_COMMAND = re.compile(r"pack bench(?! run (?:bench_data|coco_data)\b)|packer\.bench\.")


def is_benchmark(block: Block) -> bool:
    """Benchmark reproductions: each runs as its own test (they start many fresh processes)."""
    return BENCH_COMMAND.search(block.code) is not None


def runnable(page: str, benchmarks: bool) -> list[Block]:
    return [b for b in blocks_of(page) if b.runnable and is_benchmark(b) == benchmarks]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """tests/support/docs_runner.py, started once: it forks a fresh process for each page it is sent."""
    bin_dir = tmp_path_factory.mktemp("bin")
    for name, command in (("pack", "-m packer.cli"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = cli_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "docs_runner.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    yield proc
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory):
    """page_dir(page) -> the page's scratch directory, made once and shared by its tests."""
    made: dict[str, Path] = {}

    def make(page: str) -> Path:
        if page not in made:
            work = tmp_path_factory.mktemp(Path(page).stem) / "work"
            (work / "docs" / "bench").mkdir(parents=True)
            for name in ("sample_data", "scripts"):
                (work / name).symlink_to(REPO / name)
            made[page] = work
        return made[page]

    return make


def run_blocks(runner: subprocess.Popen, work: Path, blocks: list[Block], timeout: int) -> None:
    plan = []
    for block in blocks:
        kind, value = block.marker or ("", "")
        plan.append(
            {
                "page": block.page,
                "line": block.line,
                "lang": block.lang,
                "code": scaled_down(block.code),
                "first_run": scaled_down(value) if kind == "first run" else "",
                "given": value if kind == "given" else "",
            }
        )
    name = work.parent / f"plan-{blocks[0].line}"
    name.with_suffix(".json").write_text(json.dumps(plan))
    request = {"plan": str(name.with_suffix(".json")), "cwd": str(work), "log": str(name.with_suffix(".log"))}
    assert runner.stdin is not None and runner.stdout is not None
    runner.stdin.write(json.dumps({**request, "timeout": timeout}) + "\n")
    runner.stdin.flush()
    status = runner.stdout.readline().strip()
    output = name.with_suffix(".log").read_text(errors="replace")
    assert status == "0" and "ALL BLOCKS RAN" in output, f"exit status {status!r}\n{output[-6000:]}"
    assert output.count(f"--- {blocks[0].page}:") == len(plan)
    print(output)  # seconds per block, shown with -s or on failure


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p, benchmarks=False)])
def test_page_blocks_run_against_sample_data(runner, page_dir, page):
    run_blocks(runner, page_dir(page), runnable(page, benchmarks=False), timeout=280)


BENCHMARKS = [b for page in PAGES for b in runnable(page, benchmarks=True)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", BENCHMARKS, ids=lambda b: b.where)
def test_benchmark_blocks_run_scaled_down(runner, page_dir, block):
    run_blocks(runner, page_dir(block.page), [block], timeout=580)

