"""Damaging a packed dataset on purpose: private copies, byte flips, manifest edits, verify checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from packer.info.verify import verify_dataset
from readers import open_dataset
from readers.store.checksums import file_sha256
from readers.store.manifest import SEAL_FIELD, seal_of
from tests.conftest import run_cli


def edit_manifest(root: Path, change, reseal_manifest: bool = True) -> None:
    """Apply ``change`` to the manifest; by default also update its own checksum (a careful editor)."""
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    if reseal_manifest:
        data[SEAL_FIELD] = seal_of(data)
    path.write_text(json.dumps(data))


def flip_byte(path: Path, offset: int) -> None:
    """Invert the byte at ``offset``: same size, different bytes."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


SPLIT = {"samples_per_shard": 20}  # 44 samples: shards of 20, 20, 4
SMALL = {"resize": 32, "crop": 32}


def copy_of(packed, fmt: str, tmp_path: Path) -> Path:
    """A private copy of the small ``fmt`` pack (three parts), free to damage."""
    root = tmp_path / fmt
    shutil.copytree(packed(fmt, options=SPLIT, **SMALL), root, symlinks=True)
    return root


def upload_copy(s3, packed, fmt: str, name: str) -> str:
    """Upload the small ``fmt`` pack to the moto S3 bucket under ``name``; its URL."""
    fs, _ = s3
    fs.put(str(packed(fmt, options=SPLIT, **SMALL)), f"imgpack-test/{name}", recursive=True)
    return f"s3://imgpack-test/{name}"


def reseal(root: Path, shard: int, data_file: Path) -> None:
    """Record ``data_file``'s new sha256 in the manifest, as a careful hand-editor would."""
    edit_manifest(root, lambda m: m["shards"][shard].update(sha256=file_sha256(data_file)))


def read_all(root: Path) -> None:
    dataset = open_dataset(root)
    for i in range(len(dataset)):
        dataset[i]


def assert_verify_fails(root: Path, *needles: str, cli: bool = False) -> None:
    """``pack verify`` (in process, or as the real CLI) reports a problem mentioning ``needles``."""
    if cli:
        proc = run_cli("verify", root)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and ": OK" not in proc.stdout
        text = proc.stderr + proc.stdout
    else:
        report = verify_dataset(root)
        assert not report.ok
        text = "\n".join(report.problems)
    for needle in needles:
        assert needle in text, text
