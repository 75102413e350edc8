"""Running a command while sampling the peak memory of its whole process tree (benchmarks only)."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil


def tree_rss(proc: psutil.Process) -> int:
    """Resident memory of a process and all its descendants (an upper bound: shared pages count twice)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


class PeakSampler:
    """Samples tree_rss(pid) every ``interval`` seconds in a background thread."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, tree_rss(self.proc))
            except psutil.NoSuchProcess:
                return
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(cmd: list[str], **kwargs) -> tuple[float, int, subprocess.CompletedProcess]:
    """(seconds, peak tree RSS in bytes, completed process) for ``cmd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    with PeakSampler(proc.pid) as sampler:
        out, err = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err}")
    return seconds, sampler.peak, subprocess.CompletedProcess(cmd, proc.returncode, out, err)
