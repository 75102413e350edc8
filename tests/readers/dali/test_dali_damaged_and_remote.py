"""DALI on damaged datasets is a clear error, remote tar through DALI matches local, and a killed
py_workers process is an error, not a hang."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from readers.errors import ImgpackError
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA
from tests.support.damage import SMALL, SPLIT, upload_copy


# -- DALI on damaged datasets, remote tar, a killed py_workers process -----------
def _damaged(tmp_path: Path, fmt: str, damage: str) -> Path:
    """A copy of a 44-sample dataset with one image of part 1 corrupted, or part 1 truncated."""
    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    root = tmp_path / f"{fmt}-{damage}"
    # One process: this test process already runs DALI and fsspec threads, which a fork copies.
    spec = PreprocessSpec(encode="bmp" if fmt == "bmp" else "jpeg", **SMALL)
    pack_folder(SAMPLE_DATA, root, fmt, spec, workers=1, options=SPLIT)
    manifest = json.loads((root / "manifest.json").read_text())
    part = root / manifest["shards"][1]["file"]
    part = part / "data.mdb" if part.is_dir() else part
    if fmt == "bmp":  # its parts are index files: damage one image file instead
        from readers.formats import open_reader

        part = Path(os.fsdecode(open_reader(root).index.path(25)))  # sample 25, in part 1
    data = bytearray(part.read_bytes())
    if damage == "truncated":
        os.truncate(part, len(data) // 2)
        return root
    if fmt == "bmp":
        data[:2] = b"XX"
    else:  # the second JPEG of the part: zero its first bytes after the SOI marker
        at = data.find(b"\xff\xd8\xff", data.find(b"\xff\xd8\xff") + 1)
        data[at + 2 : at + 300] = bytes(298)
    part.write_bytes(bytes(data))
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["corrupt-image", "truncated"])
@pytest.mark.parametrize("fmt", format_names())
def test_dali_loader_on_a_damaged_dataset_is_a_clear_error(tmp_path, fmt, damage):
    from readers.dali import dali_loader

    root = _damaged(tmp_path, fmt, damage)
    with pytest.raises(ImgpackError) as caught:
        for _ in dali_loader(root, batch_size=8, device="cpu", crop=32, shuffle=False):
            pass
    message = str(caught.value)
    assert str(root) in message and "\n" not in message, message
    if damage == "corrupt-image":  # the sample is named, not DALI's "Critical error in pipeline"
        assert re.search(r"sample 2\d", message), message


def test_remote_tar_through_dali_matches_local(s3, packed, tmp_path):
    import torch

    from readers.dali import dali_loader

    fs, options = s3
    local = packed("tar", options=SPLIT, **SMALL)
    url = upload_copy(s3, packed, "tar", "dali-tar")
    kwargs = dict(device="cpu", crop=32, seed=5)
    want = [(x.clone(), y.clone()) for x, y in dali_loader(local, batch_size=8, **kwargs)]
    for extra in ({}, {"cache_dir": str(tmp_path / "cache")}):
        reader_options = {"storage_options": options, **extra}
        got = list(dali_loader(url, batch_size=8, reader_options=reader_options, **kwargs))
        assert len(got) == len(want) == 6
        for (xa, ya), (xb, yb) in zip(got, want):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


@pytest.mark.timeout(60)
def test_killed_dali_py_worker_is_an_error_not_a_hang(packed):
    import psutil

    from readers.dali import dali_loader

    root = packed("lmdb", options=SPLIT, **SMALL)
    # Batches of one: far more batches than DALI prefetches, so the rest need the killed worker.
    before = {p.pid for p in psutil.Process().children()}  # other tests' servers are children too
    loader = dali_loader(root, batch_size=1, device="cpu", crop=32, py_workers=2, shuffle=False)
    batches = iter(loader)
    next(batches)
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) >= 2, workers
    os.kill(workers[0].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(
        ImgpackError, match=f"a DALI py_workers process \\(pid {workers[0].pid}\\) exited with code -9"
    ):
        for _ in batches:
            pass
    assert time.monotonic() - started < 10
    # the pool's other workers are gone too: one left blocked would hang this process's exit
    assert not [p for p in workers[1:] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    fresh = dali_loader(root, batch_size=4, device="cpu", crop=32, py_workers=2, shuffle=False)
    assert sum(len(y) for _, y in fresh) == 44  # a new loader reads again
