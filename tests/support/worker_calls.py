"""What DataLoader worker processes did, seen from the test: a ``worker_init_fn`` that notes each
shard index a worker loads and each S3 session it makes in the file ``$IMGPACK_TEST_WORKER_CALLS``."""

from __future__ import annotations

import os
from pathlib import Path

CALLS_ENV = "IMGPACK_TEST_WORKER_CALLS"


def record_worker_calls(_worker_id: int) -> None:
    import readers.remote.remote_parts as remote_parts
    from readers.formats.tar.reader import TarReader

    def noted(what, call):
        def wrapper(*args, **kwargs):
            with open(os.environ[CALLS_ENV], "a") as fh:
                fh.write(f"{what}\n")
            return call(*args, **kwargs)

        return wrapper

    TarReader._load_index = noted("index", TarReader._load_index)
    remote_parts.url_fs = noted("session", remote_parts.url_fs)


def worker_calls(path: Path) -> list[str]:
    """The calls noted in ``path`` (none if the file was never written)."""
    return path.read_text().split() if path.exists() else []
