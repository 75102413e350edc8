"""`pack reindex` on damaged input: a truncated tar, member names the index cannot hold, a directory
in the label file's place; each is one line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from readers.errors import ManifestError
from readers.store.checksums import file_sha256
from tests.conftest import run_cli
from tests.support.cli import assert_one_line, pack_sample
from tests.support.damage import copy_of, edit_manifest, read_all


def test_reindex_of_a_truncated_tar_is_one_line(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    shard = root / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    proc = run_cli("reindex", root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "shard-000001.tar" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- pack reindex refuses member names the index format cannot hold --------------------------
def _rename_members(shard: Path, rename) -> None:
    """Rewrite a tar shard with every member renamed by ``rename`` (same bytes, same order)."""
    import tarfile

    members = []
    with tarfile.open(shard) as archive:
        for info in archive:
            members.append((info, archive.extractfile(info).read()))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as archive:
        for info, data in members:
            info.name = rename(info.name)
            archive.addfile(info, io.BytesIO(data))


def test_reindex_of_member_names_with_a_space_is_refused(packed, tmp_path):
    root = copy_of(packed, "tar", tmp_path)
    shard = root / "shard-000001.tar"
    _rename_members(shard, lambda name: name.replace("s", "s ", 1))
    entry = {"bytes": shard.stat().st_size, "sha256": file_sha256(shard)}
    edit_manifest(root, lambda m: m["shards"][1].update(entry))
    before = (root / "shard-000001.idx").read_bytes()
    assert_one_line(run_cli("reindex", root), str(shard), "has white space in its name", "rename the members")
    assert (root / "shard-000001.idx").read_bytes() == before  # nothing half-written
    (root / "shard-000001.idx").unlink()  # the reader's own rebuild says the same
    with pytest.raises(ManifestError, match="has white space in its name"):
        read_all(root)


def test_reindex_with_a_directory_for_the_label_file_is_one_line(tmp_path):
    from readers.formats.registry import registered

    for fmt in [name for name, f in registered().items() if f.indexer]:  # the formats reindex serves
        pack_sample(tmp_path / fmt, fmt)
        labels = tmp_path / fmt / "labels.i64"
        labels.unlink()
        labels.mkdir()
        assert_one_line(run_cli("reindex", labels.parent), f"{labels}: is a directory")
        assert labels.is_dir()  # left for the user to move
