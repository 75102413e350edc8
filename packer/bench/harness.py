"""The measuring tools every benchmark shares: memory sampler, fresh-process runs, epoch timer.

Import-light on purpose (the standard library only at import time; psutil when a sampler starts),
so that a peer's interpreter without imgpack's dependencies (FFCV's, in
packer/bench/suites/fastpath.py) can time its loader with the same ``time_epochs``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.errors import ImgpackError

# The checkout holding packer/ and readers/: a fresh child's PYTHONPATH, so it runs this code.
CODE_ROOT = Path(__file__).resolve().parents[2]


def code_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``CODE_ROOT`` first on ``PYTHONPATH`` (and ``extra`` set)."""
    path = os.pathsep.join(p for p in (str(CODE_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


class BenchError(ImgpackError):
    """A benchmark cannot run as asked (missing module, mismatched datasets, a failed run)."""


# -- memory ---------------------------------------------------------------------------------------
class MemorySampler:
    """Peak memory of a process and all its descendants, sampled by a background thread.

    ``peak_rss`` adds up each process's resident set (pages shared by forked workers count once
    per process); ``peak_pss`` adds up proportional set sizes (shared pages split between the
    processes), or is None where smaps cannot be read (or ``pss=False``: RSS only). ``pid``
    defaults to this process. Reading PSS parses every mapping of every process: a short
    ``interval`` steals CPU from many-process loaders, and from a process of gigabytes (FFCV's
    page buffers) enough to slow it several times over.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.02, pss: bool = True):
        import psutil

        self._psutil = psutil
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss: int | None = 0 if pss else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        rss = pss = 0
        procs = [self.process]
        try:
            procs += self.process.children(recursive=True)
        except self._psutil.Error:
            pass
        for proc in procs:
            try:
                if self.peak_pss is not None:
                    info = proc.memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", 0)
                else:
                    rss += proc.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.ZombieProcess):
                continue
            except self._psutil.AccessDenied:
                self.peak_pss = None  # no smaps access: RSS only
        self.peak_rss = max(self.peak_rss, rss)
        if self.peak_pss is not None:
            self.peak_pss = max(self.peak_pss, pss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.sample()
        except self._psutil.NoSuchProcess:  # an outside process that has exited
            pass


@dataclass
class Measured:
    """A command run under a ``MemorySampler``: wall time, peak memory of its tree, its output."""

    seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int | None
    returncode: int
    stdout: str
    stderr: str


def run_measured(
    cmd: list[str],
    interval: float = 0.05,
    timeout: float | None = None,
    check: bool = True,
    pss: bool = True,
    **popen: Any,
) -> Measured:
    """Run ``cmd`` in a fresh process, sampling the peak memory of its process tree from outside
    (``pss=False``: resident sets only, which costs the measured process nothing). Past
    ``timeout`` seconds the process is killed and ``TimeoutError`` raised."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    with MemorySampler(proc.pid, interval, pss) as sampler:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # its DataLoader workers see their parent gone and end
            proc.communicate()
            raise TimeoutError(f"{' '.join(map(str, cmd))}: no result within {timeout:g} s") from None
        except BaseException:  # Ctrl-C or SIGTERM of the benchmark: the measured run ends too
            proc.kill()
            proc.wait()
            raise
    seconds = time.perf_counter() - start
    if check and proc.returncode:
        raise BenchError(f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}):\n{err}")
    return Measured(seconds, sampler.peak_rss, sampler.peak_pss or None, proc.returncode, out, err)


# -- fresh processes ------------------------------------------------------------------------------
def _child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], start_method: str) -> None:
    # A spawned process defaults to spawning its own children; DataLoader workers should start
    # the way they would in the user's training script (the parent's default: fork on Linux).
    multiprocessing.set_start_method(start_method, force=True)
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:  # every failure goes back to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_isolated(fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None) -> Any:
    """``fn(*args)`` in a fresh spawned process (no page-cache handles, memory or imports carried
    over from earlier measurements), with ``env`` added to its environment from its start (so
    settings read at import, such as ``IMGPACK_JPEG_WINDOW``, apply); its result, or a
    ``BenchError`` with the child's error."""
    start_method = multiprocessing.get_start_method()
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, start_method))
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        proc.start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    send.close()
    try:
        status, payload = receive.recv()
    except EOFError:
        status, payload = "error", f"the measuring process died (exit code {proc.exitcode})"
    finally:
        proc.join()
        receive.close()
    if status != "ok":
        raise BenchError(payload)
    return payload


# -- epochs ---------------------------------------------------------------------------------------
def count_images(batch: Any) -> int:
    """Images in a batch: the length of its labels for ``(images, labels)``, else of the batch."""
    labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else batch
    return len(labels)


@dataclass
class EpochTimes:
    """Every epoch of one loader, warm-up epochs included (the first ``warmup`` of them)."""

    warmup: int = 1
    seconds: list[float] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    first_batch_s: float = float("nan")  # from ``started`` to the first batch of the first epoch

    @property
    def rates(self) -> list[float]:
        """images/s of each timed epoch (after the warm-up)."""
        timed = zip(self.images[self.warmup :], self.seconds[self.warmup :])
        return [n / s if s > 0 else 0.0 for n, s in timed]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def time_epoch(
    loader: Iterable[Any], times: EpochTimes, started: float, count: Callable[[Any], int] = count_images
) -> None:
    """Read one epoch of ``loader``, adding its seconds and images to ``times``."""
    images, begin = 0, time.perf_counter()
    for batch in loader:
        if math.isnan(times.first_batch_s):  # the first batch of the run
            times.first_batch_s = time.perf_counter() - started
        images += count(batch)
    times.seconds.append(time.perf_counter() - begin)
    times.images.append(images)


def time_epochs(
    loader: Iterable[Any],
    epochs: int,
    set_epoch: Callable[[int], None] | None = None,
    warmup: int = 1,
    started: float | None = None,
    count: Callable[[Any], int] = count_images,
) -> EpochTimes:
    """``warmup`` + ``epochs`` epochs of one loader; the first batch is timed from ``started``
    (e.g. before opening the dataset; default: now)."""
    started = time.perf_counter() if started is None else started
    times = EpochTimes(warmup)
    for epoch in range(warmup + epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        time_epoch(loader, times, started, count)
    return times


def take_turns(
    loaders: Mapping[str, Iterable[Any]],
    epochs: int,
    set_epochs: dict[str, Callable[[int], None]] | None = None,
    warmup: int = 1,
    count: Callable[[Any], int] = count_images,
) -> dict[str, EpochTimes]:
    """Several loaders read epoch by epoch in turn, so that they see the same background load."""
    started = time.perf_counter()
    times = {name: EpochTimes(warmup) for name in loaders}
    for epoch in range(warmup + epochs):
        for name, loader in loaders.items():
            if set_epochs and name in set_epochs:
                set_epochs[name](epoch)
            time_epoch(loader, times[name], started, count)
    return times


# -- the machine and the disk ---------------------------------------------------------------------
def folder_bytes(path: str | os.PathLike[str]) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    info["load_average_at_start"] = [round(x, 2) for x in load] if load else None
    info["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return info
