"""A stalled S3 server (SIGSTOP) is a RemoteError within the configured bound, reading and packing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from readers import open_dataset, open_iterable
from tests.conftest import SAMPLE_DATA
from tests.support.cli import assert_one_line
from tests.support.damage import SMALL, SPLIT
from tests.support.s3server import stopped

# -- a stalled S3 server (SIGSTOP) is a RemoteError within the configured bound -------------
BOUND = 3  # seconds ($IMGPACK_REMOTE_TIMEOUT); the default is 120


@pytest.fixture
def stoppable_s3():
    from tests.support.s3server import moto_s3_process

    with moto_s3_process() as server:
        yield server


def test_remote_call_bound_defaults_and_setting(monkeypatch):
    from readers.errors import OptionError
    from readers.remote.urls import bounded_options, call_bound

    monkeypatch.delenv("IMGPACK_REMOTE_TIMEOUT", raising=False)
    assert call_bound() == 120
    config = bounded_options("s3://b/x", None)["config_kwargs"]
    assert (config["connect_timeout"], config["read_timeout"]) == (10, 30)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", "8")
    config = bounded_options("s3://b/x", None)["config_kwargs"]
    assert call_bound() == 8 and (config["connect_timeout"], config["read_timeout"]) == (2, 2)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", "soon")
    with pytest.raises(OptionError, match="IMGPACK_REMOTE_TIMEOUT='soon': must be a positive number"):
        call_bound()


@pytest.mark.parametrize("workers", [0, 2])
def test_stalled_server_mid_read_is_a_remote_error_within_the_bound(
    packed, stoppable_s3, monkeypatch, workers
):
    from readers import make_loader
    from readers.remote.urls import RemoteError

    fs, options, proc = stoppable_s3
    fs.put(str(packed("tar", options=SPLIT, **SMALL)), "imgpack-test/ds", recursive=True)
    monkeypatch.setenv("IMGPACK_REMOTE_TIMEOUT", str(BOUND))
    monkeypatch.setenv("IMGPACK_REMOTE_AHEAD_BYTES", "2k")  # else the pass is fetched before the stall
    it = open_iterable("s3://imgpack-test/ds", batch_size=4, crop=32, storage_options=options, block_size=4)
    batches = iter(make_loader(it, num_workers=workers))
    next(batches)
    with stopped(proc):
        started = time.monotonic()
        with pytest.raises(
            RemoteError, match=r"s3://imgpack-test/ds/shard-.*no answer from the server for 3 s"
        ):
            for _ in batches:
                pass
        waited = time.monotonic() - started
    assert waited < 4 * BOUND, waited  # before: ~16 request timeouts per call (575 s at the defaults)
    monkeypatch.delenv("IMGPACK_REMOTE_TIMEOUT")  # the resumed server first answers the abandoned calls
    assert len(open_dataset("s3://imgpack-test/ds", storage_options=options)) == 44


def _cli_until_stalled(args, proc, ready, env) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``pack ARGS``, freeze the server once ``ready()`` holds, and time the exit."""
    child = subprocess.Popen(
        [sys.executable, "-m", "packer.cli", *map(str, args)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with stopped(proc):
        started = time.monotonic()
        try:
            out, err = child.communicate(timeout=60)
        finally:
            child.kill()
        waited = time.monotonic() - started
    return subprocess.CompletedProcess(args, child.returncode, out, err), waited


def test_stalled_server_mid_pack_is_one_line_within_the_bound(stoppable_s3, tmp_path):
    from tests.conftest import cli_env

    fs, options, proc = stoppable_s3
    env = {**cli_env(), "IMGPACK_REMOTE_TIMEOUT": str(BOUND)}
    storage = ("--storage-options", json.dumps(options), "--samples-per-shard", "4", "--quiet")
    out = "s3://imgpack-test/out"
    args = ("imagefolder", SAMPLE_DATA, "--to", "tar", "-o", out, *storage)
    done, waited = _cli_until_stalled(args, proc, lambda: fs.exists(f"{out}/.imgpack-progress.json"), env)
    assert_one_line(done, out, "no answer from the server for 3 s")
    assert waited < 4 * BOUND, waited  # before: 229 s and more at the defaults
    fs.put(str(SAMPLE_DATA), "imgpack-test/src", recursive=True)
    args = ("imagefolder", "s3://imgpack-test/src", "--to", "tar", "-o", tmp_path / "local", *storage)
    done, waited = _cli_until_stalled(args, proc, lambda: (tmp_path / "local").exists(), env)
    assert_one_line(done, "s3://imgpack-test/src", "no answer from the server for 3 s")
    assert waited < 4 * BOUND, waited
