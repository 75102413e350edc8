"""pack bench --memory-cap leaves no cgroup and no process behind (packer/bench/pagecache.py):
removing a cap stops what still runs in it, a SIGTERM'd benchmark removes its cap, and a cap left
by a benchmark killed outright (SIGKILL) is removed by the next one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from packer.bench.pagecache import CAP_PREFIX, MemoryCap
from readers.process import pid_alive
from tests.conftest import cli_env

pytestmark = pytest.mark.root


def sleeper_in(cap: MemoryCap) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=cap.join)


def gone(pid: int, proc: subprocess.Popen | None = None, wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None or not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_removing_a_cap_stops_what_runs_in_it():
    cap = MemoryCap(200 << 20, name=f"{CAP_PREFIX}test-remove-{os.getpid()}")
    member = sleeper_in(cap)
    assert cap.path.is_dir() and str(member.pid) in (cap.path / "cgroup.procs").read_text()
    assert cap.remove() and not cap.path.exists()
    assert gone(member.pid, member)


def test_a_cap_left_by_a_killed_benchmark_is_removed_by_the_next():
    code = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a pid that has exited (reused only after the pid space wraps)
    left = MemoryCap(200 << 20, name=f"{CAP_PREFIX}{dead_pid}")
    orphan = sleeper_in(left)  # an epoch whose benchmark was SIGKILLed
    live = MemoryCap(200 << 20, name=f"{CAP_PREFIX}{os.getpid()}")  # ours: its creator lives
    try:
        fresh = MemoryCap(200 << 20, name=f"{CAP_PREFIX}test-next-{os.getpid()}")
        assert not left.path.exists() and gone(orphan.pid, orphan)
        assert live.path.is_dir()  # a running benchmark's cap is left alone
        fresh.remove()
    finally:
        live.remove()
        left.remove()


def test_sigterm_mid_epoch_removes_the_cap_and_its_processes(packed, tmp_path):
    path = tmp_path / "ds"
    shutil.copytree(packed("lmdb"), path)
    args = ["bench", str(path), "--memory-cap", "400M", "--rounds", "50", "--readahead", "0", "-q"]
    args += ["--workers", "1", "--crop", "32"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    bench = subprocess.Popen([sys.executable, "-m", "packer.cli", *args], env=cli_env(), **pipes)
    procs = os.path.join(MemoryCap.parent()[0], f"{CAP_PREFIX}{bench.pid}", "cgroup.procs")
    members: list[int] = []
    deadline = time.monotonic() + 120
    while not members and time.monotonic() < deadline and bench.poll() is None:
        try:
            members = [int(p) for p in open(procs).read().split()]
        except OSError:
            pass
        time.sleep(0.05)
    assert members, f"no epoch ran in the cap: {bench.communicate()[1][-2000:]}"
    time.sleep(0.5)  # the epoch process and its worker are reading now
    bench.send_signal(signal.SIGTERM)
    _, err = bench.communicate(timeout=60)
    assert bench.returncode != 0 and "Traceback" not in err
    assert not os.path.exists(os.path.dirname(procs))
    assert all(gone(pid) for pid in members)
