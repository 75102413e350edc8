"""Read errors name the dataset, the part and the sample; a truncated LMDB file is refused before it
is mapped (no SIGBUS)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from readers import open_dataset, open_iterable
from readers.errors import DecodeError
from readers.formats import open_reader
from readers.store.checksums import file_sha256
from tests.conftest import cli_env
from tests.support.damage import assert_verify_fails, copy_of, edit_manifest

# -- a truncated LMDB file is refused before it is mapped (no SIGBUS) ---------------------------
READ_SCRIPT = """
import sys
from readers import open_dataset
from readers.errors import ImgpackError
for root in sys.argv[1:]:
    for verify, cache in ((False, None), (True, None), (True, "ram")):
        try:
            ds = open_dataset(root, decode="numpy", verify=verify, cache=cache)
            for i in range(len(ds)):
                ds[i]
            print("read everything", verify, cache)
        except ImgpackError as exc:
            print(type(exc).__name__, exc)
"""


def test_truncated_lmdb_is_an_error_not_sigbus(packed, tmp_path):
    roots = []
    for reseal_it in (False, True):
        root = tmp_path / f"ds-{reseal_it}"
        shutil.copytree(packed("lmdb", resize=32, crop=32), root)
        data = root / "data-000000.lmdb" / "data.mdb"
        os.truncate(data, data.stat().st_size // 2)
        if reseal_it:  # the manifest agrees with the short file: LMDB's own header still says more
            entry = {"bytes": data.stat().st_size, "sha256": file_sha256(data)}
            edit_manifest(root, lambda m, entry=entry: m["shards"][0].update(entry))
        roots.append(str(root))
    # One process reads both copies three ways (plain, verify=True, cache="ram"): a SIGBUS kills it.
    args = [sys.executable, "-c", READ_SCRIPT, *roots]
    proc = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("ManifestError") and "data.mdb" in line for line in lines)
    assert "holds" in lines[0] and "truncated, LMDB needs" in lines[3]
    assert_verify_fails(Path(roots[1]), "truncated, LMDB needs", cli=True)


# -- every read error names the dataset, the part and the sample --------------------------------
def test_corrupt_jpeg_in_a_tar_shard_names_its_sample(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    reader = open_reader(root)
    index = reader.handle(1).index
    start = int(index.image_offset[3])
    shard = root / "shard-000001.tar"
    with open(shard, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\0" * 64)  # the JPEG markers are gone
    pattern = r"shard-000001.tar, sample 23: jpeg image bytes do not decode"
    with pytest.raises(DecodeError, match=pattern):
        open_dataset(root, decode="numpy")[23]
    it = open_iterable(root, shuffle=False, block_size=10)
    with pytest.raises(DecodeError, match=pattern):
        list(it)
    it = open_iterable(root, shuffle=False, batch_size=8, resize=32)
    with pytest.raises(DecodeError, match=pattern):
        list(it)
    assert_verify_fails(root, "shard-000001.tar")


def test_broken_bmp_names_its_file_and_sample(packed, tmp_path):
    root = copy_of(packed, "bmp", tmp_path)
    path = Path(os.fsdecode(open_reader(root).index.path(5)))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DecodeError, match=rf"sample 5 \(.*{path.name}\): bmp image bytes do not decode"):
        open_dataset(root, decode="numpy")[5]
    assert_verify_fails(root, path.name)
