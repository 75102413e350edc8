"""The page cache and memory caps, for benchmarks and tests of uncached reads.

- ``evict``: drop a dataset's files (or one file) from the page cache (``POSIX_FADV_DONTNEED`` per file, after
  writing back dirty pages): needs no root and leaves other programs' caches alone; pages a live
  process has mapped stay, so each measured epoch runs in a fresh process.
- ``drop_all_caches``: the whole machine's (``echo 3 > /proc/sys/vm/drop_caches``, root).
- ``resident``: which part of byte ranges is cached, page by page (``mincore``).
- ``MemoryCap``: a memory cgroup (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``) under
  this process's own, for the process tree of one measured epoch. Removing it stops what still
  runs in it (an epoch cut short), and a new one removes those a killed benchmark left behind.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from readers.errors import ImgpackError
from readers.process import pid_alive

PAGE = 4096
CAP_PREFIX = "imgpack-bench-"
_OWNED_CAP = re.compile(re.escape(CAP_PREFIX) + r"(\d+)$")  # named after the benchmark's pid


class CacheError(ImgpackError):
    """The page cache or a memory cgroup cannot be controlled here (no root, no controller)."""


def dataset_files(root: str | os.PathLike) -> list[Path]:
    """The files of the dataset at ``root``: every file under the folder, or ``root`` itself where it
    is one file (a peer's own copy, FFCV's ``.beton``)."""
    if Path(root).is_file():
        return [Path(root)]
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def evict(root: str | os.PathLike, tries: int = 5) -> int:
    """Drop every file of the dataset at ``root`` from the page cache; the bytes it covers.

    Pages the kernel still holds in per-CPU lists are skipped by one pass, so it tries again
    (``tries`` passes at most) until at most 1% of the pages are left."""
    total = 0
    for _ in range(tries):
        total = 0
        for path in dataset_files(root):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages are not dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
        if dataset_resident(root) <= 0.01:
            break
    return total


def drop_all_caches() -> None:
    """The whole page cache (root only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise CacheError(
            f"/proc/sys/vm/drop_caches: {exc.strerror}; dropping every cache needs root, or leave out "
            "--drop-caches (the dataset's own files are evicted then)"
        ) from None


def _libc():
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def cached_pages(fd: int) -> bytes:
    """One byte per page of the file behind ``fd``, odd where the page is in the page cache
    (``mincore`` over a mapping that is never touched: asking reads nothing from the disk, unlike a
    ``RWF_NOWAIT`` read, which starts readahead when it misses)."""
    import ctypes
    import mmap

    size = os.fstat(fd).st_size
    if size == 0:
        return b""
    libc = _libc()
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise CacheError(f"mmap for mincore failed: {os.strerror(ctypes.get_errno())}")
    try:
        vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        if libc.mincore(addr, size, vec) != 0:
            raise CacheError(f"mincore failed: {os.strerror(ctypes.get_errno())}")
        return vec.raw
    finally:
        libc.munmap(addr, size)


def resident(ranges: Iterable[tuple[int | str | os.PathLike, int, int]]) -> float:
    """The fraction of the pages of ``ranges`` ((path or open descriptor, offset, length); length 0:
    to the end of the file) that are in the page cache."""
    cached = total = 0
    maps: dict[int | str, bytes] = {}
    for path, offset, length in ranges:
        key = path if isinstance(path, int) else os.fspath(path)
        if key not in maps:
            if isinstance(key, int):
                maps[key] = cached_pages(key)
            else:
                fd = os.open(key, os.O_RDONLY)
                try:
                    maps[key] = cached_pages(fd)
                finally:
                    os.close(fd)
        pages = maps[key]
        end = len(pages) * PAGE if length <= 0 else offset + length
        first, last = offset // PAGE, min(len(pages), (end + PAGE - 1) // PAGE)
        total += max(0, last - first)
        cached += sum(b & 1 for b in pages[first:last])
    return cached / total if total else 1.0


def dataset_resident(root: str | os.PathLike) -> float:
    """The fraction of the dataset's pages in the page cache."""
    return resident((p, 0, 0) for p in dataset_files(root) if p.stat().st_size)


def device_read_bytes(path: str | os.PathLike) -> int | None:
    """Bytes the block device holding ``path`` has read since boot (``/proc/diskstats``: sectors
    read x 512), or None where the device is not listed (a network filesystem, a tmpfs). Taken
    around an epoch on an idle machine, what it read from the disk: more than the dataset's bytes
    means pages read twice (evicted before their last use)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and (int(fields[0]), int(fields[1])) == (major, minor):
            return int(fields[5]) * 512
    return None


def read_sequentially(root: str | os.PathLike, block: int = 4 << 20) -> tuple[int, float]:
    """(bytes, seconds) to read the dataset's files front to back in ``block`` reads: with them
    evicted first, the disk's sequential rate."""
    import time

    total, start = 0, time.perf_counter()
    for path in dataset_files(root):
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(block):
                total += len(chunk)
    return total, time.perf_counter() - start


class MemoryCap:
    """A memory cgroup of ``limit`` bytes for the processes that ``join`` it (and their children)."""

    def __init__(self, limit: int, name: str = ""):
        self.limit = limit
        self.path, self.version = self._create(name or f"{CAP_PREFIX}{os.getpid()}")

    @staticmethod
    def _own(controller: str) -> tuple[str, str]:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        for line in lines:
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return "1", path
        for line in lines:
            if line.startswith("0::"):
                return "2", line[3:]
        raise CacheError("/proc/self/cgroup: this process is in no cgroup")

    @classmethod
    def parent(cls) -> tuple[Path, str]:
        """(the cgroup caps are made in: this process's own, its cgroup version)."""
        version, own = cls._own("memory")
        if version == "1":
            return Path("/sys/fs/cgroup/memory") / own.lstrip("/"), version
        mount = Path("/sys/fs/cgroup/unified")
        mount = mount if mount.is_dir() else Path("/sys/fs/cgroup")
        return mount / own.lstrip("/"), version

    def _create(self, name: str) -> tuple[Path, str]:
        base, version = self.parent()
        if version == "1":
            limit_file = "memory.limit_in_bytes"
        else:
            limit_file = "memory.max"
            controllers = (base / "cgroup.controllers").read_text().split() if base.is_dir() else []
            if "memory" not in controllers:
                raise CacheError(f"{base}: the memory controller is not enabled for this cgroup (v2)")
        remove_stale_caps(base)
        path = base / name
        try:
            path.mkdir(exist_ok=True)
            (path / limit_file).write_text(f"{self.limit}\n")
        except OSError as exc:
            raise CacheError(
                f"{path}: cannot create a memory cgroup ({exc.strerror}); --memory-cap needs root "
                "or a delegated cgroup"
            ) from None
        return path, version

    def join(self) -> None:
        """Move the calling process into the cgroup (as a ``preexec_fn``)."""
        (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def peak(self) -> int | None:
        """The most memory the cgroup used (v1 ``max_usage_in_bytes``, v2 ``memory.peak``)."""
        name = "memory.max_usage_in_bytes" if self.version == "1" else "memory.peak"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def anonymous(self) -> int | None:
        """The cgroup's anonymous memory now: its processes' own heaps and stacks, no page cache
        (v1 ``memory.stat`` ``total_rss``, v2 ``anon``)."""
        key = "total_rss" if self.version == "1" else "anon"
        try:
            lines = (self.path / "memory.stat").read_text().splitlines()
        except OSError:
            return None
        values = dict(line.split()[:2] for line in lines if line.count(" ") >= 1)
        return int(values[key]) if key in values else None

    def events(self) -> str:
        """OOM kills seen in the cgroup (for the report)."""
        name = "memory.oom_control" if self.version == "1" else "memory.events"
        try:
            return " ".join((self.path / name).read_text().split())
        except OSError:
            return ""

    def remove(self) -> bool:
        """Stop the processes still in the cgroup (an epoch interrupted mid-way, its DataLoader
        workers) and remove it; whether it is gone."""
        return remove_cgroup(self.path)


def remove_cgroup(path: Path, wait: float = 5.0) -> bool:
    """Kill every process in the cgroup at ``path`` and remove it (a cgroup with members cannot be
    removed; a killed process leaves it a moment later); whether it is gone within ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            members = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            members = []
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def remove_stale_caps(base: Path) -> list[Path]:
    """Remove the caps under ``base`` whose benchmark process is gone (killed before its cleanup,
    e.g. by SIGKILL), with whatever still runs in them; the ones removed."""
    removed: list[Path] = []
    try:
        children = list(base.iterdir())
    except OSError:
        return removed
    for child in children:
        owner = _OWNED_CAP.match(child.name)
        if owner and child.is_dir() and not pid_alive(int(owner.group(1))) and remove_cgroup(child, 1.0):
            removed.append(child)
    return removed
