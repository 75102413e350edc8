"""A spool the DataLoader workers of one rank share, so each byte range is fetched once per rank.

Workers take turns by batch and a batch draws its samples from a whole shuffle window, so the
workers of a rank read from the same blocks of a remote shard: each fetching what it needs would
download the shard ``num_workers`` times. Instead every worker plans the rank's requests (the same
list in each: the order is known), and the first worker to need a request *claims* it (a file
created with ``O_EXCL``), fetches it and *publishes* it into a directory in shared memory
(``/dev/shm``); the others map the published file. A request's file is unlinked once every worker
that needs it is done with it (each appends a byte to its counter file; the last one removes it):
the pages live on only while a worker still maps them.

Nothing here decides what is read: a claim whose owner died is taken over, a publication that
fails (a full ``/dev/shm``) leaves the bytes to their fetcher and the claim to the next worker, and a
fetch error is published, so the workers waiting for it fail at once with the same message instead
of at the end of the bound. A spool directory that outlives its pass (a pass broken off, a killed
job) is removed by the next pass that opens a spool: the next pass of the same stream, or any
once its owner process is gone or it has been idle for ``STALE_SECONDS``.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from readers.remote.urls import CALL_BOUND_ENV, RemoteError

SPOOL_ENV = "IMGPACK_REMOTE_SPOOL"
PREFIX = "imgpack-spool-"
STALE_SECONDS = 600.0
POLL_FIRST, POLL_MOST = 0.0005, 0.01  # seconds between looks for a request another worker fetches


def spool_root(room: int, environ: Any = None) -> Path | None:
    """Where spools go: ``$IMGPACK_REMOTE_SPOOL``, else ``/dev/shm`` where it has ``room`` bytes
    free (a container's is often 64 MB), else the temporary directory; None where the variable
    is ``off`` (each worker fetches for itself)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(SPOOL_ENV, "").strip()
    if chosen.lower() in ("off", "0", "none"):
        return None
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    try:
        free = os.statvfs(shm)
        if os.access(shm, os.W_OK | os.X_OK) and free.f_bavail * free.f_frsize >= room:
            return shm
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(root: Path, owner: int, stream: str, keep: str) -> None:
    """Remove spools left behind by earlier passes: their owner process is gone, or they belong
    to an earlier pass of the same ``stream`` (a pass broken off: its workers never closed it),
    or they have been idle for ``STALE_SECONDS``."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(PREFIX) or entry.name == keep:
            continue
        try:
            pid_text, rest = entry.name[len(PREFIX) :].split("-", 1)
            pid = int(pid_text)
            st = entry.stat(follow_symlinks=False)
        except (ValueError, OSError):
            continue
        if st.st_uid != os.getuid():
            continue
        earlier = pid == owner and rest.rsplit("-", 1)[0] == stream
        if earlier or not _alive(pid) or now - st.st_mtime > STALE_SECONDS:
            shutil.rmtree(entry.path, ignore_errors=True)


class Spool:
    """The spool directory of one pass of one rank over one remote dataset.

    ``needers[i]``: how many workers read from request ``i`` (the same numbers in every worker);
    ``members``: the workers that meet here. Use ``obtain`` to get a request's bytes (fetched here
    or by another worker), ``done_with`` when this worker will not read it again, ``close`` at the
    end of the pass."""

    def __init__(self, path: Path, needers: np.ndarray, members: int):
        self.path = path
        self.needers = needers
        self.members = members
        self.counted: set[int] = set()
        self.lock = threading.Lock()
        self.published_bytes = 0  # fetched here and shared
        self.mapped_bytes = 0  # fetched by another worker and mapped here

    @classmethod
    def open(
        cls, root: Path | None, owner: int, stream: str, plan: str, needers: np.ndarray, members: int
    ) -> Spool | None:
        """The spool of ``owner``'s (the rank's main process) ``stream`` for the pass whose requests
        hash to ``plan``, under ``root`` (made if new); None where there is no usable one (no root,
        not writable, another user's): then each worker fetches for itself."""
        if root is None:
            return None
        name = f"{PREFIX}{owner}-{stream}-{plan}"
        path = root / name
        try:
            sweep(root, owner, stream, name)
            path.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError:
            return None
        if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
            return None
        return cls(path, needers, members)

    def _file(self, index: int, kind: str = "") -> str:
        return os.path.join(self.path, f"{index}{kind}")

    # -- getting a request's bytes ---------------------------------------------------------------
    def obtain(self, index: int, fetch: Callable[[], bytes], bound: float, where: str) -> Any:
        """Request ``index``'s bytes: fetched here (``fetch``) and published when this worker is
        the first to claim it, else mapped once the worker that claimed it has published it."""
        deadline = time.monotonic() + bound
        pause = POLL_FIRST
        while True:
            claimed = self._claim(index)
            if claimed is None:  # no spool to share through any more: fetch for this worker alone
                return fetch()
            if claimed:
                return self._fetch_and_publish(index, fetch)
            got = self._published(index)
            if got is not None:
                return got
            self._raise_published_error(index, where)
            if not self._claim_alive(index):
                self._release(index)  # its owner died before publishing: take it over
                continue
            if time.monotonic() > deadline:
                raise RemoteError(
                    f"{where}: reading ahead: no answer from the server for {bound:g} s to the "
                    "DataLoader worker fetching this range for the others; the server is stalled or "
                    f"unreachable (${CALL_BOUND_ENV} sets this bound)"
                )
            time.sleep(pause)
            pause = min(POLL_MOST, pause * 2)

    def prefetch(self, index: int, fetch: Callable[[], bytes]) -> bool:
        """Fetch and publish request ``index`` for the workers, unless one of them has claimed it
        (the rank's main process starting a pass: ``readers.remote.prime``). Whether it did; a
        spool removed meanwhile (the pass is over) is not made again."""
        if not self._claim(index, remake=False):
            return False
        published = self._fetch_and_publish(index, fetch)
        if isinstance(published, mmap.mmap):
            published.close()  # the workers map their own
        return True

    def _claim(self, index: int, remake: bool = True) -> bool | None:
        """Whether this worker claimed request ``index`` (None: the spool cannot be written)."""
        path = self._file(index, ".claim")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        except OSError:
            if not remake:
                return None
            try:  # the directory was swept away under an idle pass: make it again
                os.makedirs(self.path, mode=0o700, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return False
            except OSError:
                return None
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        return True

    def _claim_alive(self, index: int) -> bool:
        """Whether request ``index`` is claimed by a live process (a missing claim is not)."""
        try:
            with open(self._file(index, ".claim"), "rb") as fh:
                text = fh.read(32)
        except OSError:
            return False
        try:
            return _alive(int(text))
        except ValueError:  # claimed a moment ago, pid not written yet
            return True

    def _release(self, index: int) -> None:
        try:
            os.unlink(self._file(index, ".claim"))
        except OSError:
            pass

    def _fetch_and_publish(self, index: int, fetch: Callable[[], bytes]) -> Any:
        try:
            data = fetch()
        except BaseException as exc:
            self._publish_error(index, exc)
            raise
        tmp = self._file(index, f".tmp-{os.getpid()}-{threading.get_ident()}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                mapped = mmap.mmap(fd, len(data), access=mmap.ACCESS_READ) if len(data) else b""
            finally:
                os.close(fd)
            os.rename(tmp, self._file(index))
        except OSError:  # a full /dev/shm: keep the bytes here, let the next worker try its own
            _unlink(tmp)
            self._release(index)
            return data
        with self.lock:
            self.published_bytes += len(data)
        return mapped

    def _published(self, index: int) -> Any:
        try:
            fd = os.open(self._file(index), os.O_RDONLY)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
        finally:
            os.close(fd)
        with self.lock:
            self.mapped_bytes += size
        return mapped

    def _publish_error(self, index: int, exc: BaseException) -> None:
        message = str(exc) or type(exc).__name__
        try:
            fd = os.open(self._file(index, ".err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, message.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            self._release(index)  # unpublished: the next worker tries the server itself

    def _raise_published_error(self, index: int, where: str) -> None:
        try:
            with open(self._file(index, ".err"), "rb") as fh:
                message = fh.read().decode("utf-8", "replace")
        except OSError:
            return
        raise RemoteError(message or f"{where}: reading ahead failed in another DataLoader worker")

    # -- letting go --------------------------------------------------------------------------------
    def done_with(self, index: int) -> None:
        """This worker will not read request ``index`` again: count it, and remove the request's
        files once every worker that needs it has."""
        with self.lock:
            if index in self.counted:
                return
            self.counted.add(index)
        if self._count(self._file(index, ".n")) >= int(self.needers[index]):
            for kind in ("", ".claim", ".err", ".n"):
                _unlink(self._file(index, kind))

    def close(self, needed: Iterable[int]) -> None:
        """The end of this worker's pass: every request it ``needed`` is done with, and the last
        worker out removes the directory (with whatever a fetch finished after its pass left)."""
        for index in needed:
            self.done_with(index)
        if self._count(os.path.join(self.path, "closed")) >= self.members:
            shutil.rmtree(self.path, ignore_errors=True)

    @staticmethod
    def _count(path: str) -> int:
        """Add one to the counter file at ``path`` (one byte appended: atomic among processes)
        and return its count; 0 where it cannot be written."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, b".")
                return os.fstat(fd).st_size
            finally:
                os.close(fd)
        except OSError:
            return 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already (another worker removed it), or never made
        pass
