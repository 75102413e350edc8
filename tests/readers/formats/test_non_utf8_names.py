"""A file name that is not UTF-8 packs into every format, --resume included."""

from __future__ import annotations

import os
import shutil

import pytest

from readers import read_manifest
from readers.formats import format_names
from tests.conftest import run_cli
from tests.support.cli import write_images

# -- a file name that is not UTF-8 packs into every format, --resume included ------------

ODD_NAME = b"caf\xe9.png"  # Latin-1 bytes: not UTF-8


def _odd_source(tmp_path, plain=1):
    src = write_images(tmp_path / "src" / "c", [f"plain{i}.png" for i in range(plain)], size=(300, 300))
    shutil.copy(src / "plain0.png", os.path.join(os.fsencode(src), ODD_NAME))
    return tmp_path / "src"


@pytest.mark.parametrize("fmt", format_names())
def test_a_file_name_that_is_not_utf8_packs(tmp_path, fmt):
    from packer.info.verify import verify_dataset

    out = tmp_path / "out"
    proc = run_cli("imagefolder", _odd_source(tmp_path), "--to", fmt, "-o", out, "--resize", "16", "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 2 and verify_dataset(out).ok


def test_tfrecord_keeps_the_file_name_bytes_and_resume_packs_it(tmp_path):
    import struct

    from readers.formats.tfrecord._example import decode_example
    from tests.support.packrun import SLOW_PACK, kill_group, run_pack, start_pack, wait_started

    out = tmp_path / "out"
    # 40 images at 256 px as PNG: a pack still running when it is killed
    args = [
        _odd_source(tmp_path, plain=40),
        "--to",
        "tfrecord",
        "-o",
        out,
        "--workers",
        "1",
        "-q",
        *SLOW_PACK,
    ]
    proc = start_pack(*args)
    wait_started(out, proc)
    kill_group(proc.pid)
    proc.communicate()
    rc, text = run_pack(*args, "--resume")
    assert rc == 0, text
    [shard] = read_manifest(out).shards
    data = (out / shard.file).read_bytes()
    names = []
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        names += decode_example(data[12 : 12 + length])["image/filename"]
        data = data[12 + length + 4 :]
    assert b"c/" + ODD_NAME in [bytes(n) for n in names] and len(names) == 41
