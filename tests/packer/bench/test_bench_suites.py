"""The benchmark suites: one registry (packer/bench/suites), listed by `pack bench suites`, run by
`pack bench run NAME [ARGS]` with the suite's own options and exit status; the docs' table made
from the registry; no module reaches another through a sys.path edit."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.bench.suites import SUITES, run_suite, suite_named, suite_names
from packer.cli import main
from readers.errors import OptionError
from tests.support.markdown import REPO

SUITES_DIR = REPO / "packer" / "bench" / "suites"


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_every_suite_module_is_registered_and_every_entry_runs_a_main():
    names = suite_names()
    assert len(names) == len(set(names))
    in_folder = {p.stem for p in SUITES_DIR.glob("*.py") if p.stem != "__init__"}
    registered = {s.module.rsplit(".", 1)[1] for s in SUITES if s.module.startswith("packer.bench.suites.")}
    # a module of the folder is a suite, or the child side a suite starts in a fresh process
    assert {m for m in in_folder - registered if not m.endswith("_child")} == set()
    assert registered <= in_folder
    for suite in SUITES:
        assert suite.kind in ("suite", "data") and "\n" not in suite.description, suite
        assert callable(suite.load().main), suite.name


def test_pack_bench_suites_lists_the_registry():
    result = invoke("suites")
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.splitlines() if line.startswith("  ")]
    by_kind = [s.name for s in SUITES if s.kind == "suite"] + [s.name for s in SUITES if s.kind == "data"]
    assert listed == by_kind
    assert "fastpath" in result.output and "[needs DALI" in result.output


def test_pack_bench_run_gives_the_suite_its_arguments(tmp_path):
    out = tmp_path / "folder"
    result = invoke("run", "bench_data", "--n", "6", "--classes", "2", "--workers", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    images = sorted(out.glob("class_*/*.jpg"))
    assert len(images) == 6 and {p.parent.name for p in images} == {"class_000", "class_001"}
    assert json.loads((out / ".params.json").read_text())["n"] == 6

    coco = invoke("run", "coco_data", str(tmp_path / "coco"), "--count", "3")
    assert coco.exit_code == 0, coco.output
    assert len(json.loads((tmp_path / "coco" / "instances.json").read_text())["images"]) == 3


def test_a_suites_help_and_exit_status_are_its_own(capsys):
    with pytest.raises(SystemExit) as done:
        run_suite("bench_data", ["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: pack bench run bench_data")
    with pytest.raises(SystemExit) as missing:  # --n and --out are required
        run_suite("bench_data", [])
    assert missing.value.code == 2
    assert sys.argv[0] != "pack bench run bench_data"  # given back


def test_an_unknown_suite_is_refused_with_the_choices():
    result = invoke("run", "fast_path")
    assert result.exit_code == 2 and "no suite 'fast_path'" in result.output and "fastpath" in result.output
    with pytest.raises(OptionError, match="choose one of .*fastpath"):
        suite_named("fast_path")


def test_pack_bench_still_compares_datasets_and_its_help_names_the_suites(tmp_path):
    result = invoke(str(tmp_path / "missing"))  # routed to `pack bench compare`
    assert result.exit_code == 1 and "missing" in result.output
    group_help = invoke("--help").output
    assert "pack bench suites" in group_help and "pack bench run NAME" in group_help
    assert "--baseline" in invoke("compare", "--help").output


def test_a_suite_runs_as_a_module_in_a_fresh_process(tmp_path):
    from tests.conftest import cli_env

    cmd = [sys.executable, "-m", "packer.bench.suites.scan_memory", "--help"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    assert done.returncode == 0 and "--sizes" in done.stdout, done.stderr


def test_the_docs_table_is_made_from_the_registry():
    spec = importlib.util.spec_from_file_location("suite_table", REPO / "docs" / "_hooks" / "suite_table.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert hook.MARKER in page
    built = hook.on_page_markdown(page, None, None, None)
    assert hook.MARKER not in built
    for suite in SUITES:
        assert f"| `{suite.name}` |" in built and f"pack bench run {suite.name} --help" in built


def test_no_module_edits_sys_path():
    # Modules import each other as packages (pytest's pythonpath, PYTHONPATH for children).
    needle = "sys.path." + "insert"
    git = ["git", "ls-files", "*.py"]
    tracked = subprocess.run(git, cwd=REPO, capture_output=True, text=True, check=True)
    files = [Path(REPO, f) for f in tracked.stdout.split()]
    assert len(files) > 100
    assert [f for f in files if f.exists() and needle in f.read_text()] == []
