"""Helpers for the fault-injection tests of packing: real `pack` subprocesses, signals, strace."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from packer.output.output_dir import PROGRESS_NAME
from readers import open_dataset
from tests.conftest import SAMPLE_DATA, cli_env

SLOW_PACK = ("--resize", "256", "--encode", "png")  # ~30 ms an image: a pack worth interrupting


def copy_source(dst: Path, copies: int = 1) -> Path:
    """sample_data copied ``copies`` times into each class (``copy<i>/`` subfolders)."""
    for cls in sorted(p for p in SAMPLE_DATA.iterdir() if p.is_dir()):
        for i in range(copies):
            shutil.copytree(cls, dst / cls.name / f"copy{i}")
    return dst


def pack_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "packer.cli", "imagefolder", *map(str, args)]


def default_signal_handling() -> None:
    """In the child before exec: SIGINT and SIGTERM back to their defaults. A shell starts a
    background job (``make test &``) with SIGINT ignored, and an ignored signal stays ignored
    across exec, so without this the pack would never see the test's Ctrl-C."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def start_pack(*args: object, strace: list[str] | None = None) -> subprocess.Popen:
    """``pack imagefolder ARGS`` in its own session (so a test can signal its whole group), with
    default signal handling however the test run was launched."""
    cmd = pack_cmd(*args)
    if strace:
        cmd = ["strace", "-f", "-qq", "-o", "/dev/null", *strace, *cmd]
    return subprocess.Popen(
        cmd,
        env=cli_env(),
        start_new_session=True,
        preexec_fn=default_signal_handling,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_pack(*args: object, strace: list[str] | None = None, timeout: float = 120) -> tuple[int, str]:
    proc = start_pack(*args, strace=strace)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def syscall_count(name: str, *args: object) -> int:
    """How many successful ``name`` system calls ``pack imagefolder ARGS`` makes (strace)."""
    trace = subprocess.run(
        ["strace", "-f", "-qq", "-e", f"trace={name}", "-o", "/dev/stdout", *pack_cmd(*args)],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    return sum(1 for line in trace.stdout.splitlines() if f"{name}(" in line and "= -1" not in line)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"pack ended before {path} appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def wait_started(out: Path, proc: subprocess.Popen) -> None:
    """Until the pack has set up its output (its progress file exists)."""
    wait_for(out / PROGRESS_NAME, proc)


def kill_after_parts(src: Path, out: Path, args: tuple, parts: int = 1, timeout: float = 60) -> None:
    """Start ``pack imagefolder SRC -o OUT ARGS`` and kill -9 its process group once ``parts``
    parts are recorded in its progress file."""
    import json

    proc = start_pack(src, "-o", out, *args)
    wait_started(out, proc)
    deadline = time.monotonic() + timeout
    while len(json.loads((out / PROGRESS_NAME).read_text() or "{}").get("parts", [])) < parts:
        assert proc.poll() is None and time.monotonic() < deadline, f"{parts} parts never finished"
        time.sleep(0.02)
    kill_group(proc.pid)
    assert proc.wait() == -signal.SIGKILL


def wait_workers(proc: subprocess.Popen, workers: int, timeout: float = 60) -> None:
    """Until the pack (its own process group) runs ``workers`` pool processes besides itself."""
    deadline = time.monotonic() + timeout
    while len(live_processes(proc.pid)) < workers + 1:
        assert proc.poll() is None, f"pack ended before its workers started: {proc.communicate()}"
        assert time.monotonic() < deadline, "the pool workers never started"
        time.sleep(0.02)


def live_processes(group: int) -> list[int]:
    """Processes of process group ``group`` still running (zombies, already dead, excluded)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            alive.append(int(entry.name))
    return alive


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def dataset_arrays(path: Path) -> list[tuple[bytes, int]]:
    """Every sample of a packed dataset as (pixel bytes, label)."""
    ds = open_dataset(path, decode="numpy")
    return [(np.ascontiguousarray(image).tobytes(), int(label)) for image, label in ds]


def leftovers(out: Path) -> list[str]:
    """Temp files anywhere below ``out``."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.tmp"))
