"""A real S3-compatible server (moto) on 127.0.0.1: the object store of the remote benchmarks and
of the tests that read or write s3:// URLs (their fixture: tests/support/s3server.py). Needs the dev extra."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BUCKET = "imgpack-test"


@contextmanager
def stopped(proc):
    """The server process frozen (SIGSTOP): connections are accepted by the kernel, never answered."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_s3(bucket: str = BUCKET) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A moto S3 server on 127.0.0.1 holding an empty ``bucket``: (s3fs filesystem, storage_options)."""
    from moto.server import ThreadedMotoServer

    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import s3fs

        # moto keeps its buckets in this process, across servers: start from an empty store.
        reset = f"http://127.0.0.1:{port}/moto-api/reset"
        urllib.request.urlopen(urllib.request.Request(reset, method="POST"), timeout=30).close()

        # The region comes from AWS_DEFAULT_REGION: a us-east-1 bucket takes no LocationConstraint.
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(bucket)
        yield fs, options
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def moto_s3_process(bucket: str = BUCKET) -> Iterator[tuple[Any, dict[str, Any], subprocess.Popen]]:
    """A moto S3 server in its own process (so a test can SIGSTOP or kill it) holding an empty
    ``bucket``: (s3fs filesystem, storage_options, the server process)."""
    import s3fs

    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    command = [
        sys.executable,
        "-c",
        "from moto.server import main; main()",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto server process did not start") from None
                time.sleep(0.2)
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(bucket)
        yield fs, options, proc
    finally:
        proc.kill()
        proc.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

