"""The Ray engine under faults, on a real local Ray cluster (``ray start --head`` in its own
processes): a worker process killed in the middle of a part, and the driver killed with SIGKILL.
Either way the pack ends (retried, or one clear line) and ``--resume`` gives the same dataset as
an uninterrupted pack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import cli_env
from tests.support.packrun import (
    SLOW_PACK,
    copy_source,
    dataset_arrays,
    kill_group,
    run_pack,
    start_pack,
    wait_started,
)

pytestmark = pytest.mark.timeout(600)
ARGS = ("--to", "tar", "--samples-per-shard", "6", *SLOW_PACK, "--quiet")


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    """A real local Ray cluster (head node with 2 CPUs) that outlives the drivers killed here."""
    temp = tmp_path_factory.mktemp("ray")
    ray = str(Path(sys.executable).with_name("ray"))
    os.environ["RAY_AUTH_MODE"] = "disabled"  # for this cluster and the pack drivers (cli_env)
    start = [ray, "start", "--head", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}",
             "--port=0", "--disable-usage-stats"]  # fmt: skip
    proc = subprocess.run(start, capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    address = next(
        line.split("'")[1] for line in (proc.stdout + proc.stderr).splitlines() if "--address='" in line
    )
    yield address
    subprocess.run([ray, "stop", "--force"], capture_output=True, env=cli_env(), timeout=120)
    os.environ.pop("RAY_AUTH_MODE", None)


def _part_task_pids() -> list[int]:
    """Ray worker processes running a part task right now (Ray titles them ``ray::_pack_part``)."""
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("ray::_pack_part"):
            pids.append(proc.pid)
    return pids


@pytest.fixture(scope="module")
def source_and_reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("ray-faults")
    src = copy_source(base / "src", copies=2)
    reference = base / "reference"
    rc, text = run_pack(src, "-o", reference, *ARGS, timeout=300)
    assert rc == 0, text
    return src, dataset_arrays(reference)


def test_a_ray_worker_killed_mid_part_then_resume_gives_the_same_dataset(
    ray_address, source_and_reference, tmp_path
):
    src, reference = source_and_reference
    out = tmp_path / "out"
    pack = start_pack(src, "-o", out, *ARGS, "--engine", "ray", "--ray-address", ray_address)
    deadline = time.monotonic() + 120
    while not (victims := _part_task_pids()):
        assert pack.poll() is None, pack.communicate()
        assert time.monotonic() < deadline, "no part task ever ran"
        time.sleep(0.02)
    os.kill(victims[0], signal.SIGKILL)
    stdout, stderr = pack.communicate(timeout=300)
    if pack.returncode != 0:  # failed cleanly: one line, then --resume finishes it
        assert "Traceback" not in stderr and stderr.strip().count("\n") == 0, stderr
        rc, text = run_pack(
            src, "-o", out, *ARGS, "--engine", "ray", "--ray-address", ray_address, "--resume", timeout=300
        )
        assert rc == 0, text
    assert dataset_arrays(out) == reference
    assert not (out / ".ray-staging").exists()


def test_a_ray_driver_killed_by_sigkill_then_resume_gives_the_same_dataset(
    ray_address, source_and_reference, tmp_path
):
    src, reference = source_and_reference
    out = tmp_path / "out"
    pack = start_pack(src, "-o", out, *ARGS, "--engine", "ray", "--ray-address", ray_address)
    wait_started(out, pack)
    deadline = time.monotonic() + 120
    while not _part_task_pids():
        assert pack.poll() is None, pack.communicate()
        assert time.monotonic() < deadline, "no part task ever ran"
        time.sleep(0.02)
    kill_group(pack.pid)  # the driver (and anything in its session): a real SIGKILL
    pack.wait(timeout=60)
    assert pack.returncode == -signal.SIGKILL
    rc, text = run_pack(
        src, "-o", out, *ARGS, "--engine", "ray", "--ray-address", ray_address, "--resume", timeout=300
    )
    assert rc == 0, text
    assert dataset_arrays(out) == reference
    assert not (out / ".ray-staging").exists()
