"""Interrupting a pack with real signals: every interruption leaves an output that --resume finishes
and --force clears, Ctrl-C / SIGTERM stop cleanly without hanging, and workers die with the pack."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from packer.engine.pack_run import pack_folder
from packer.info.verify import verify_dataset
from packer.sources.source import scan_folder
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.packrun import (
    SLOW_PACK,
    copy_source,
    dataset_arrays,
    kill_group,
    leftovers,
    live_processes,
    run_pack,
    start_pack,
    syscall_count,
    wait_started,
    wait_workers,
)

pytestmark = pytest.mark.slow  # real pack subprocesses, signalled and resumed


def test_ctrl_c_of_a_bmp_pack_then_resume(tmp_path):
    src = copy_source(tmp_path / "src", copies=12)  # still packing when the signal comes, even idle
    out = tmp_path / "ds"
    proc = start_pack(src, "--to", "bmp", "-o", out, "--workers", "2", "-q", "--resize", "256")
    wait_started(out, proc)
    time.sleep(0.4)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "--resume" in err and "Traceback" not in err, err
    args = (src, "--to", "bmp", "-o", out, "--workers", "2", "-q", "--resize", "256")
    rc, text = run_pack(*args, "--resume")
    assert rc == 0, text
    assert run_cli("verify", out).returncode == 0
    assert not (out / ".staging").exists()


# (signal, sent to the whole group like a terminal's Ctrl-C, or to the main process only)
STOPS = [(signal.SIGINT, True)] * 3 + [(signal.SIGTERM, False), (signal.SIGTERM, True)]


def test_ctrl_c_and_sigterm_with_workers_stop_cleanly_and_never_hang(tmp_path):
    # Long enough that every signal lands mid-pack: one landing after a finished pack finds the
    # interpreter exiting with default handlers (rc -2, nothing to test).
    src = copy_source(tmp_path / "src", copies=8)
    out = tmp_path / "ds"
    outcomes = []
    for sig, whole_group in STOPS:
        proc = start_pack(src, "--to", "lmdb", "-o", out, "--workers", "2", "-q", "--force", *SLOW_PACK)
        wait_workers(proc, 2)
        time.sleep(random.uniform(0.0, 1.0))
        (os.killpg if whole_group else os.kill)(proc.pid, sig)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            err = "HANG"
        time.sleep(0.2)
        left = live_processes(proc.pid)
        kill_group(proc.pid)
        outcomes.append((sig.name, whole_group, proc.poll(), left, err.strip().splitlines()[-1:]))
    expected = ["interrupted; re-run the same command with --resume to finish"]
    assert all(rc == 130 and not left and last == expected for _, _, rc, left, last in outcomes), outcomes
    rc, text = run_pack(src, "--to", "lmdb", "-o", out, "--workers", "2", "-q", "--resume", *SLOW_PACK)
    assert rc == 0, text


def test_workers_die_with_the_main_process(tmp_path):
    src = copy_source(tmp_path / "src", copies=6)
    out = tmp_path / "ds"
    for attempt in range(2):
        proc = start_pack(src, "--to", "tar", "-o", out, "--workers", "2", "-q", "--force", *SLOW_PACK)
        wait_workers(proc, 2)
        time.sleep(0.3 + 0.4 * attempt)
        assert len(live_processes(proc.pid)) == 3  # the pack and its two workers
        os.kill(proc.pid, signal.SIGKILL)  # the main process only
        proc.wait()
        deadline = time.monotonic() + 5
        while live_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = live_processes(proc.pid)
        kill_group(proc.pid)
        assert left == [], f"attempt {attempt}: workers {left} outlived the killed pack"


@pytest.mark.parametrize(
    "fmt, shards, syscall, last",
    [
        ("hdf5", "1", "pwrite64", 7),  # every write of the HDF5 finish step (attributes rewritten in place)
        ("lmdb", "2", "rename", 4),  # every progress / manifest rename of a two-part pack
    ],
)
def test_kill_at_each_write_of_the_finish_step_then_resume(tmp_path, fmt, shards, syscall, last):
    args = [SAMPLE_DATA, "--to", fmt, "--resize", "32", "--workers", "1", "-q", "--shards", shards]
    reference = tmp_path / "reference"
    rc, text = run_pack(*args, "-o", reference)
    assert rc == 0, text
    total = syscall_count(syscall, *args, "-o", tmp_path / "count")
    behaved = 0
    for when in range(total - last + 1, total + 1):
        out = tmp_path / f"killed-{when}"
        inject = ["-e", f"trace={syscall}", "-e", f"inject={syscall}:signal=SIGKILL:when={when}"]
        rc, text = run_pack(*args, "-o", out, strace=inject)
        assert rc != 0, f"{syscall} #{when} of {total}: the pack was not killed"
        options = {"shards": int(shards)}
        pack_folder(SAMPLE_DATA, out, fmt, PreprocessSpec(resize=32), workers=1, options=options, resume=True)
        assert verify_dataset(out).ok
        assert dataset_arrays(out) == dataset_arrays(reference)
        assert leftovers(out) == [], f"{syscall} #{when}: temp files left"
        behaved += 1
    assert behaved == last


def test_a_ray_task_stops_and_drops_its_staged_part_when_the_driver_is_gone(tmp_path):
    """Run in-process (a Ray cluster start costs ~30 s here): the task body of ``--engine ray``
    with the pid of a driver that was killed, and with a live one."""
    import socket

    from packer.engine._ray_engine import DriverGone, _pack_part, _staged_writer
    from readers.formats.registry import open_writer

    items = scan_folder(SAMPLE_DATA).items
    writer = open_writer("lmdb", tmp_path / "ds", PreprocessSpec(resize=24), {})
    staged = _staged_writer(writer)
    dead = subprocess.Popen(["sleep", "60"])
    dead.kill()
    dead.wait()
    with pytest.raises(DriverGone):
        _pack_part(staged, 0, items, writer.spec, "skip", (socket.gethostname(), dead.pid))
    assert list(staged.out.iterdir()) == []  # nothing staged is left, nothing was committed
    assert not any(p.name.startswith("data-") for p in writer.out.iterdir())
    result, carried = _pack_part(staged, 0, items, writer.spec, "skip", (socket.gethostname(), os.getpid()))
    assert result["shards"][0]["count"] == len(items) == len(carried)
