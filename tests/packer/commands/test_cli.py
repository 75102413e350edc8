"""The `pack` command line, through click's runner and as a real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main, parse_size
from readers import read_manifest
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.disks import mounted_tmpfs


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_help_explains_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("imagefolder", "info", "verify"):
        assert command in result.output
    result = invoke("imagefolder", "--help")
    for option in (
        "--to",
        "--resize",
        "--crop",
        "--encode",
        "--workers",
        "--on-error",
        "--resume",
        "--force",
    ):
        assert option in result.output


def test_pack_info_verify_as_subprocess(tmp_path):
    out = tmp_path / "ds"
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "64", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["packed"] == read_manifest(out).num_samples > 0
    assert summary["skipped"] == 0 and summary["bytes"] > 0
    info = run_cli("info", out, check=True)
    assert "lmdb" in info.stdout and "samples" in info.stdout
    info_json = json.loads(run_cli("info", out, "--json", check=True).stdout)
    assert info_json["num_samples"] == summary["packed"]
    verify = run_cli("verify", out, check=True)
    assert "OK" in verify.stdout


def test_progress_and_summary_go_to_the_terminal(tmp_path):
    result = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", tmp_path / "ds", "--resize", "32")
    assert result.exit_code == 0, result.output
    assert "packed" in result.output and "img/s" in result.output
    quiet = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", tmp_path / "q", "--resize", "32", "-q")
    assert quiet.exit_code == 0 and quiet.output == ""


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "ds"
    assert (
        invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32", "-q").exit_code == 0
    )
    again = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32", "-q")
    assert again.exit_code != 0 and "--force" in again.output
    forced = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32", "-q", "--force")
    assert forced.exit_code == 0
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("do not delete")
    refused = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", precious, "-q", "--force")
    assert refused.exit_code != 0 and "not an imgpack output" in refused.output
    assert (precious / "thesis.txt").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["imagefolder", "/nonexistent/folder", "--to", "lmdb", "-o", "{tmp}/o"], "no such folder"),
        (["imagefolder", "{tmp}/empty", "--to", "lmdb", "-o", "{tmp}/o"], "no class folders"),
        (["imagefolder", "{sample}", "--to", "lmdb", "-o", "/proc/imgpack-out"], "cannot write here"),
        (["info", "{tmp}/empty"], "not a packed dataset"),
        (
            [
                "imagefolder",
                "{sample}",
                "--to",
                "lmdb",
                "-o",
                "{tmp}/o",
                "--encode",
                "original",
                "--resize",
                "5",
            ],
            "original",
        ),
    ],
)
def test_user_mistakes_get_one_line_errors(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    args = [a.format(tmp=tmp_path, sample=SAMPLE_DATA) for a in args]
    proc = run_cli(*args)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.root
@pytest.mark.parametrize("readonly", [False, True])
def test_full_or_readonly_disk(tmp_path, readonly):
    with mounted_tmpfs(tmp_path / "mnt", "256k", readonly) as mnt:
        proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", mnt / "ds", "--encode", "png")
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
        assert str(mnt / "ds") in proc.stderr
        assert ("Read-only" in proc.stderr) if readonly else ("space" in proc.stderr)
        assert not (mnt / "ds" / "manifest.json").exists()


def test_verify_detects_corruption(tmp_path):
    out = tmp_path / "ds"
    run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32", "-q", check=True)
    data = out / "data-000000.lmdb" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    proc = run_cli("verify", out)
    assert proc.returncode == 1
    assert "sha256 does not match" in proc.stderr and "FAILED" in proc.stdout


def test_interrupt_names_resume_only_for_commands_that_have_it(tmp_path, monkeypatch):
    import packer.info.verify

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.info.verify, "verify_dataset", interrupted)
    result = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert result.exit_code == 130 and result.output.strip() == "interrupted"
    monkeypatch.setattr("packer.engine.pack_run.pack", interrupted)
    result = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", tmp_path / "out", "-q")
    assert result.exit_code == 130
    assert result.output.strip() == "interrupted; re-run the same command with --resume to finish"


def test_parse_size():
    assert parse_size("512MB") == 512_000_000
    assert parse_size("1GiB") == 2**30
    assert parse_size("100") == 100
    with pytest.raises(Exception, match="not a size"):
        parse_size("lots")


def test_console_script_is_installed():
    exe = shutil.which("pack", path=str(Path(sys.executable).parent))
    assert exe, "the `pack` console script is missing; install with pip install -e ."
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "imagefolder" in proc.stdout
