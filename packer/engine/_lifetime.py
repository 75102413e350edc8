"""Tying a helper process's life to its parent's (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import ctypes
import os
import signal

from readers.process import pid_alive

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when ``parent`` exits, however it exits.

    Without this, pool workers of a main process killed with -9 or SIGTERM keep running (and keep
    its stdout open, so ``pack ... | tail`` never returns). Elsewhere than Linux this is a no-op.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was in place
        os._exit(1)


def process_alive(host: str, pid: int) -> bool:
    """Whether process ``pid`` on ``host`` still runs; True when that cannot be known from here."""
    import socket

    return host != socket.gethostname() or pid_alive(pid)
