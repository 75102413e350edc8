"""The benchmark suites: one registry (packer/bench/suites), listed by `pack bench suites`, run by
`pack bench run NAME [ARGS]` with the suite's own options and exit status; the docs' table made
from the registry; no module reaches another through a sys.path edit."""

from __future__ import annotations

import importlib
import io
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


# -- object_storage: the peers that stream their own formats (LitData, MosaicML Streaming) --------
# Their venvs are not imgpack's (nor CI's): what runs here is the export every peer's format is
# written from, the child's import-light start, and the suite's handling of the peers' Pythons.
def test_the_peer_export_yields_every_stored_image_once_with_its_label(packed):
    from packer.bench.suites.object_storage_child import chunk_bytes, tar_samples
    from readers.formats import open_reader

    pack = packed("tar", options={"samples_per_shard": 10}, resize=24)
    reader = open_reader(pack)
    assert len(reader.manifest.shards) > 2
    exported = list(tar_samples(pack))
    assert [index for index, _, _ in exported] == list(range(len(reader)))
    for index, jpeg, label in exported:
        record = reader.read(index)
        assert jpeg == bytes(record.data) and label == record.label  # the stored bytes, not re-encoded
    assert chunk_bytes(pack) == max(s.bytes for s in reader.manifest.shards)


def test_the_peer_export_names_the_shard_whose_sample_has_no_label(packed, tmp_path):
    import shutil
    import tarfile

    from packer.bench.suites.object_storage_child import tar_samples

    pack = tmp_path / "pack"
    shutil.copytree(packed("tar", options={"samples_per_shard": 10}, resize=24), pack)
    shard = pack / json.loads((pack / "manifest.json").read_text())["shards"][1]["file"]
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    dropped = next(m.name for m, _ in members if m.name.endswith(".cls"))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            if member.name != dropped:
                tar.addfile(member, io.BytesIO(data))
    with pytest.raises(ValueError, match=rf"{shard.name}: sample '{dropped[:-4]}' has \['jpg'\]"):
        list(tar_samples(pack))


def test_the_peer_child_imports_only_the_standard_library_and_starts_as_a_file():
    import ast

    from packer.bench.suites.object_storage import CHILD

    top = [n for n in ast.parse(CHILD.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert modules and modules <= set(sys.stdlib_module_names) | {"__future__"}, modules
    loaded = (  # what running the file loads beyond the standard library
        "import runpy, sys; before = set(sys.modules); runpy.run_path(sys.argv[1]); "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", loaded, str(CHILD)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-I", str(CHILD), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "{write,read}" in done.stdout, done.stderr


def fake_peer_python(tmp_path: Path, distinct: int) -> Path:
    """A stand-in for a peer's Python: records its calls; ``write`` makes --out, ``read`` prints a
    result with ``distinct`` samples and what it got from the suite."""
    script = tmp_path / "peer-python"
    script.write_text(f"""#!{sys.executable}
import json, os, pathlib, sys
assert sys.argv[1] == "-I" and sys.argv[2].endswith("object_storage_child.py"), sys.argv
args = sys.argv[3:]
with open({str(tmp_path / "calls")!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "write":
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir()
    (out / "index.json").write_text("{{}}")
else:
    seen = {{k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH")}}
    print("a peer's own chatter")
    print(json.dumps({{"images": 12, "distinct": {distinct}, "seconds": 0.5, "first_batch_images": 4,
                      "first_batch_s": 0.3, "env": seen}}))
""")
    script.chmod(0o755)
    return script


def test_the_suite_leaves_out_a_peer_whose_python_is_missing_and_says_so(tmp_path, capsys):
    from packer.bench.suites.object_storage import parse_args, peer_pythons

    missing = tmp_path / "no-venv" / "bin" / "python"
    there = fake_peer_python(tmp_path, 12)
    args = parse_args(["--litdata-python", str(missing), "--streaming-python", str(there)])
    assert peer_pythons(args) == {"streaming": there}
    out = capsys.readouterr().out.splitlines()
    assert out == [f"litdata remote: left out: no Python at {missing} "
                   "(make its venv, see docs/object-storage.md, or pass --litdata-python)"]  # fmt: skip
    defaults = parse_args([])
    assert defaults.litdata_python == Path("/work/peers/litdata-venv/bin/python")
    assert defaults.streaming_python == Path("/work/peers/streaming-venv/bin/python")


def test_the_suite_exports_once_and_times_a_peer_through_its_child(tmp_path, monkeypatch):
    from packer.bench.suites.object_storage import export_peer, peer_epoch

    python = fake_peer_python(tmp_path, 12)
    pack = tmp_path / "tar-n12-s5"
    out = export_peer("litdata", python, pack, tmp_path)
    assert out == tmp_path / "litdata-tar-n12-s5" and (out / "index.json").exists()
    assert export_peer("litdata", python, pack, tmp_path) == out  # made once
    assert not list(tmp_path.glob("*.partial"))

    monkeypatch.setenv("PYTHONPATH", "/somewhere/imgpack")
    storage = {"key": "K", "secret": "S", "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}
    epoch = peer_epoch("streaming", python, "http://127.0.0.1:2", storage, 2, expected=12)
    assert epoch == (12, 0.5, 4, 0.3) and epoch.rate == 24 and round(epoch.steady) == 40  # 8 images in 0.2 s
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    endpoint = ["--endpoint", "http://127.0.0.1:2"]
    assert calls == [
        ["write", "litdata", "--pack", str(pack), "--out", str(tmp_path / "litdata-tar-n12-s5.partial")],
        ["read", "streaming", "--url", "s3://bench/streaming", *endpoint, "--workers", "2"],
    ]

    with pytest.raises(RuntimeError, match="streaming read 11 distinct images of 12"):
        peer_epoch("streaming", fake_peer_python(tmp_path, 11), "http://127.0.0.1:2", storage, 2, 12)


def test_the_peer_child_gets_the_credentials_and_none_of_imgpacks_paths(monkeypatch):
    from packer.bench.suites.object_storage import child_env

    monkeypatch.setenv("PYTHONPATH", "/somewhere/imgpack")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
    env = child_env({"key": "K", "secret": "S"})
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], "PYTHONPATH" in env) == ("K", "S", False)
    env = child_env({})  # moto's options carry no keys: the environment's
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("from-env", "from-env-secret")


def test_the_object_storage_table_compares_imgpack_with_the_best_peer():
    import argparse

    from packer.bench.suites.object_storage import table

    def row(delay: int, **peers: int) -> dict:
        rates = {"imgpack remote": 600, "imgpack remote, read-ahead off": 100, "webdataset remote": 400,
                 **{f"{p} remote": v for p, v in peers.items()}, "imgpack local warm": 900,
                 "server ceiling (whole GETs)": 3000}  # fmt: skip
        return {"delay_ms": delay, **rates, "rounds": {k: [v] for k, v in rates.items()}}

    args = argparse.Namespace(n=12, per_shard=5, server="s3rver", workers=2, rounds=1)
    text = table([row(0, litdata=1200, streaming=500), row(30, litdata=300, streaming=200)], args)
    assert "| litdata remote | 1,200 | 300 |" in text and "| streaming remote | 500 | 200 |" in text
    assert "| imgpack remote vs best peer | 0.50x (litdata) | 1.50x (webdataset) |" in text
    assert "| imgpack remote vs webdataset | 1.50x | 1.50x |" in text
    alone = table([row(0)], args)  # no peer venv: webdataset is the best peer
    assert "| imgpack remote vs best peer | 1.50x (webdataset) |" in alone and "litdata" not in alone
    fresh = row(0, litdata=1200)
    fresh["imgpack remote, fresh process"] = 480  # as the peers are timed: the one fair comparison
    assert "| imgpack remote (fresh process) vs best peer | 0.40x (litdata) |" in table([fresh], args)
    assert "fresh process" not in alone
    steady = row(0, litdata=1200)
    steady["steady"] = {k: v * 2 for k, v in steady.items() if k not in ("delay_ms", "rounds")}
    steady["steady"]["imgpack remote"] = 3600  # after its first batch imgpack outpaces litdata's 2,400
    both = table([steady], args)
    whole, after = both.split("| img/s after the first batch |")
    assert "| imgpack remote vs best peer | 0.50x (litdata) |" in whole
    assert "| imgpack remote | 3,600 |" in after
    assert "| imgpack remote vs best peer | 1.50x (litdata) |" in after
