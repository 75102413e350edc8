"""The tests' S3 server: the ``s3`` fixture over packer/bench/s3server.py's moto server (which the
remote benchmarks use too), and its helpers under the names the tests import."""

from __future__ import annotations

import pytest

from packer.bench.s3server import BUCKET, free_port, moto_s3, moto_s3_process, stopped

__all__ = ["BUCKET", "free_port", "moto_s3", "moto_s3_process", "s3", "stopped"]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 for this module; yields (s3fs filesystem, storage_options)."""
    with moto_s3() as server:
        yield server
