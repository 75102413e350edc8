"""A TCP proxy on 127.0.0.1 that adds a fixed delay to each request it forwards.

It stands for the round trip of a real object store (20-50 ms) in front of a local S3 server,
where ``tc netem`` is not available: each time a client sends after the server has answered (a
new HTTP request on a kept-alive connection), the bytes wait ``delay`` seconds before they are
forwarded. Connections are served concurrently, as a real store serves them.
"""

from __future__ import annotations

import multiprocessing
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to ``target``, each request delayed; counts the requests and
    the bytes the server sent back (``served_bytes``: headers included).

    It runs in a process of its own, as a real store does: in the measuring process its threads
    would hold the interpreter's lock while they copy every byte, and slow down the work of a
    reader's main process there (readers/remote/prime.py fetches from it) but not its workers'."""

    def __init__(self, target: tuple[str, int], delay: float):
        self.target = target
        self.delay = delay
        context = multiprocessing.get_context("fork")  # forked: it starts at once, importing nothing
        self._requests = context.Value("q", 0)
        self._served = context.Value("q", 0)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.process = context.Process(target=self._accept, name="delay-proxy", daemon=True)
        self.process.start()
        self.listener.close()  # the proxy's process holds it

    @property
    def requests(self) -> int:
        return int(self._requests.value)

    @property
    def served_bytes(self) -> int:
        return int(self._served.value)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:  # the proxy's process, until it is terminated
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=30)
        except OSError:
            client.close()
            return
        answered = True  # the next bytes from the client start a new request
        with client, server:
            while True:
                ready, _, _ = select.select([client, server], [], [])
                for sock in ready:
                    data = sock.recv(1 << 20)
                    if not data:
                        return
                    if sock is client:
                        if answered:
                            with self._requests.get_lock():
                                self._requests.value += 1
                            time.sleep(self.delay)
                            answered = False
                        server.sendall(data)
                    else:
                        answered = True
                        with self._served.get_lock():
                            self._served.value += len(data)
                        client.sendall(data)

    def close(self) -> None:
        self.process.terminate()
        self.process.join(10)


@contextmanager
def delayed(endpoint: str, delay: float) -> Iterator[DelayProxy]:
    """A ``DelayProxy`` in front of ``http://host:port`` for the block; yields it."""
    host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
    proxy = DelayProxy((host, int(port)), delay)
    try:
        yield proxy
    finally:
        proxy.close()
