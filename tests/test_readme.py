"""The README's code runs: every fenced block, in order, against sample_data (issue 17).

How a block is treated:
- ``python`` blocks run in one shared namespace (a later block may use an earlier one's names);
  ``bash``/``sh`` and unlabelled blocks run with bash, ``pack`` and ``python`` being this checkout's;
- ``text`` blocks are program output, not code;
- a marker comment on the line right above a block changes that:
  ``<!-- readme-test: not run: REASON -->`` (a GPU, S3, installing packages: the reason is
  required and printed), ``<!-- readme-test: first run: COMMAND -->`` (a shell command that makes
  what the block reads, e.g. a dataset only mentioned in prose) and
  ``<!-- readme-test: given: PYTHON -->`` (names a fragment leaves to the reader, e.g. a count).

Everything runs in a scratch directory holding ``sample_data`` and ``scripts`` (links into this
checkout), with the user's data swapped for sample_data and the sizes scaled down (SUBSTITUTIONS:
44 images instead of ImageNet, 2 epochs instead of 90, 2 workers), so the README cannot drift
from the code without this test failing.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, cli_env

README = REPO / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(not run|first run|given):\s*(.*?)\s*-->")
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
]


@dataclass
class Block:
    line: int  # 1-based line of the opening fence in README.md
    lang: str
    code: str
    marker: tuple[str, str] | None

    @property
    def runnable(self) -> bool:
        return self.lang != "text" and not (self.marker and self.marker[0] == "not run")


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1] if i else ""
        found = MARKER.search(above)
        marker = (found.group(1), found.group(2)) if found else None
        blocks.append(Block(i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", marker))
        i = end + 1
    return blocks


def scaled_down(code: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        code = re.sub(pattern, replacement, code)
    return code


RUNNER = r"""
import json, subprocess, sys, time, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__readme__"}
for block in blocks:
    print(f"--- README.md line {block['line']} ({block['lang'] or 'shell'})", flush=True)
    started = time.perf_counter()
    try:
        if block["first_run"]:
            subprocess.run(["bash", "-euo", "pipefail", "-c", block["first_run"]], check=True)
        if block["lang"] == "python":
            if block["given"]:
                exec(block["given"], namespace)
            exec(compile(block["code"], f"README.md:{block['line']}", "exec"), namespace)
        else:
            subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]], check=True)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: README.md block at line {block['line']}", flush=True)
        sys.exit(1)
    print(f"    {time.perf_counter() - started:.1f} s", flush=True)
print("ALL BLOCKS RAN", flush=True)
"""


def test_every_readme_block_is_run_or_says_why_not():
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 10
    for block in blocks:
        assert block.lang in ("python", "text", *SHELL), f"README.md:{block.line}: unknown block language"
        if block.marker and block.marker[0] == "not run":
            assert len(block.marker[1]) > 10, f"README.md:{block.line}: say why the block cannot run"
    skipped = [b for b in blocks if not b.runnable and b.lang != "text"]
    assert len(skipped) <= 4, [(b.line, b.marker) for b in skipped]  # most of the README runs
    assert sum(b.lang == "python" and b.runnable for b in blocks) >= 5


def is_benchmark(block: Block) -> bool:
    """Benchmark reproductions: each runs as its own test (they start many fresh processes)."""
    return any(word in block.code for word in ("pack bench", "scripts/scaling.py", "make_bench_data.py"))


RUNNABLE = [b for b in readme_blocks(README.read_text(encoding="utf-8")) if b.runnable]


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory) -> Path:
    """The scratch directory every block runs in, shared so that later blocks read earlier output."""
    root = tmp_path_factory.mktemp("readme")
    work = root / "work"
    (work / "docs" / "bench").mkdir(parents=True)
    (root / "bin").mkdir()
    for name in ("sample_data", "scripts"):
        (work / name).symlink_to(REPO / name)
    for name, command in (("pack", "-m packer.cli"), ("python", "")):
        shim = root / "bin" / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return work


def run_blocks(work: Path, blocks: list[Block]) -> None:
    plan = []
    for block in blocks:
        kind, value = block.marker or ("", "")
        plan.append(
            {
                "line": block.line,
                "lang": block.lang,
                "code": scaled_down(block.code),
                "first_run": scaled_down(value) if kind == "first run" else "",
                "given": value if kind == "given" else "",
            }
        )
    name = f"plan-{blocks[0].line}"
    (work.parent / f"{name}.json").write_text(json.dumps(plan))
    (work.parent / "runner.py").write_text(RUNNER)
    env = cli_env()
    env["PATH"] = f"{work.parent / 'bin'}{os.pathsep}{env['PATH']}"
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [sys.executable, str(work.parent / "runner.py"), str(work.parent / f"{name}.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ALL BLOCKS RAN" in proc.stdout, output[-6000:]
    assert output.count("--- README.md line") == len(plan)
    print(proc.stdout)  # seconds per block, shown with -s or on failure


@pytest.mark.slow
def test_readme_blocks_run_against_sample_data(readme_dir):
    run_blocks(readme_dir, [b for b in RUNNABLE if not is_benchmark(b)])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", [b for b in RUNNABLE if is_benchmark(b)], ids=lambda b: f"line{b.line}")
def test_readme_benchmark_blocks_run_scaled_down(readme_dir, block):
    if not (readme_dir / "train.lmdb" / "manifest.json").exists():  # run alone: the packing block first
        run_blocks(readme_dir, [b for b in RUNNABLE if "--to lmdb -o train.lmdb" in b.code][:1])
    run_blocks(readme_dir, [block])
