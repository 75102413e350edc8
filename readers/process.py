"""Small facts about processes, shared by the readers and the packer."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (True when it exists but is not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def frozen_for_fork(freeze: bool = True) -> Iterator[None]:
    """While it lasts, the objects that exist are out of garbage collection (``gc.freeze``, as
    Python's documentation advises before a fork); this process takes them back at its end.

    A process forked meanwhile (a DataLoader worker) then never walks its parent's heap in its
    own collections: those write into every object they visit, so they copied the parent's pages
    and took ~0.15 s of each worker's CPU before its first batch in a fresh process (the parent
    had just parsed its libraries and models), and they finalized the parent's garbage there (a
    DALI pipeline's __del__ shut the parent's pipeline down). A program that froze objects
    itself keeps its own choice."""
    if not freeze or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class ProcessPool:
    """A thread pool made on first use in the process that uses it. A forked child (a DataLoader
    worker) has none of its parent's pool threads, so work it submitted to the parent's pool
    would wait forever: it gets a pool of its own. Not pickled (a new process makes its own)."""

    def __init__(self, threads: int, name: str):
        self.threads = threads
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
                self._pid = os.getpid()
            return self._pool

    def shutdown(self) -> None:
        """Wait for the work submitted in this process, and drop its pool."""
        pool = self._pool if self._pid == os.getpid() else None
        if pool is not None:
            pool.shutdown(wait=True)
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["threads"], state["name"])  # type: ignore[misc]
