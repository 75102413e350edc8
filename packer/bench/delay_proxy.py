"""A TCP proxy on 127.0.0.1 that adds a fixed delay to each request it forwards.

It stands for the round trip of a real object store (20-50 ms) in front of a local S3 server,
where ``tc netem`` is not available: each time a client sends after the server has answered (a
new HTTP request on a kept-alive connection), the bytes wait ``delay`` seconds before they are
forwarded. Connections are served concurrently, as a real store serves them.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to ``target``, each request delayed; counts the requests and
    the bytes the server sent back (``served_bytes``: headers included)."""

    def __init__(self, target: tuple[str, int], delay: float):
        self.target = target
        self.delay = delay
        self.requests = 0
        self.served_bytes = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="delay-proxy", daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
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
            while not self.stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(1 << 20)
                    if not data:
                        return
                    if sock is client:
                        if answered:
                            with self.lock:
                                self.requests += 1
                            time.sleep(self.delay)
                            answered = False
                        server.sendall(data)
                    else:
                        answered = True
                        with self.lock:
                            self.served_bytes += len(data)
                        client.sendall(data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.listener.close()


@contextmanager
def delayed(endpoint: str, delay: float) -> Iterator[DelayProxy]:
    """A ``DelayProxy`` in front of ``http://host:port`` for the block; yields it."""
    host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
    proxy = DelayProxy((host, int(port)), delay)
    try:
        yield proxy
    finally:
        proxy.close()
