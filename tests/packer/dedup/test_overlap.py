"""``pack overlap A B``: the samples of B found in A, across formats, remote, from hashes alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packer.dedup.overlap import load_hashes, overlap_pairs, read_indices
from packer.engine.pack_run import pack_folder
from readers import read_manifest, source_paths
from readers.formats import format_named, format_names
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import run_cli
from tests.support.dedup import planted_folder
from tests.support.s3server import BUCKET

SPEC = PreprocessSpec(resize=48)


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """A train pack (first format), a val pack (last format) holding an exact and a near copy of
    two train images, and a clean val pack; the copies' rels, per their originals."""
    root = tmp_path_factory.mktemp("leak")
    train_src, val_src, clean_src = root / "train-src", root / "val-src", root / "clean-src"
    planted_folder(train_src, range(10))
    copies = planted_folder(val_src, range(100, 108))  # its own copies: within val, not leaks
    shutil.copyfile(train_src / "c0/s0.jpg", val_src / "c1/leak_exact.jpg")
    shutil.copyfile(train_src / "c1/near_copy.jpg", val_src / "c0/leak_near.jpg")  # a near copy of s1
    planted_folder(clean_src, range(200, 206))
    formats = format_names()
    train, val, clean = root / "train", root / "val", root / "clean"
    pack_folder(train_src, train, formats[0], SPEC, workers=1)
    pack_folder(val_src, val, formats[-1], SPEC, workers=1)
    pack_folder(clean_src, clean, formats[0], SPEC, workers=1)
    assert read_manifest(train).format != read_manifest(val).format
    return train, val, clean, copies


def _index_of(ds: Path, rel: str) -> int:
    return list(source_paths(ds)).index(rel)


def test_overlap_finds_the_leaks_and_exits_1_across_formats(leaky, tmp_path):
    train, val, clean, _ = leaky
    indices = tmp_path / "leaks.txt"
    sheet = tmp_path / "sheet.png"
    proc = run_cli("overlap", train, val, "--json", "--indices-out", indices, "--show", sheet)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hashes"] == {"a": "stored", "b": "stored"}
    by_b = {p["b"]: p for p in result["pairs"]}
    exact = by_b[_index_of(val, "c1/leak_exact.jpg")]
    assert exact["a"] == _index_of(train, "c0/s0.jpg") and exact["distance"] == 0
    # exact: the same stored bytes, so only where both packs store the same encoding
    same_encoding = read_manifest(train).encoding == read_manifest(val).encoding
    assert exact["kind"] == ("exact" if same_encoding else "near")
    near = by_b[_index_of(val, "c0/leak_near.jpg")]
    # the leaked file is byte for byte train's near copy, so it is an exact pair with that one
    assert near["a"] in (_index_of(train, "c1/near_copy.jpg"), _index_of(train, "c1/s1.jpg"))
    assert result["found"] == len(result["pairs"]) == 2, result["pairs"]
    assert read_indices(indices) == sorted(by_b)
    assert sheet.stat().st_size > 0
    proc = run_cli("overlap", train, clean)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 of" in proc.stdout


def _spoil_data_parts(ds: Path) -> None:
    """Overwrite every part the manifest lists (size kept): only the hashes are left readable."""
    for shard in read_manifest(ds).shards:
        path = ds / shard.file
        for part in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
            part.write_bytes(b"\0" * part.stat().st_size)


def test_overlap_reads_only_the_stored_hashes(leaky, tmp_path):
    train, val, _, _ = leaky
    before = overlap_pairs(load_hashes(str(train)).records, load_hashes(str(val)).records, 12)
    spoiled = []
    for ds in (train, val):
        copy = tmp_path / ds.name
        shutil.copytree(ds, copy)
        _spoil_data_parts(copy)
        spoiled.append(copy)
    proc = run_cli("overlap", *spoiled, "--json")
    assert proc.returncode == 1, proc.stderr
    after = json.loads(proc.stdout)["pairs"]
    assert after == [p.to_dict() for p in before] and len(after) == 2


def test_overlap_of_remote_datasets(leaky, s3):
    fs, options = s3
    train, val, _, _ = leaky
    for ds in (train, val):
        fs.put(str(ds) + "/", f"{BUCKET}/overlap/{ds.name}/", recursive=True)
    urls = [f"s3://{BUCKET}/overlap/{ds.name}" for ds in (train, val)]
    remote = overlap_pairs(load_hashes(urls[0], options).records, load_hashes(urls[1], options).records, 12)
    local = overlap_pairs(load_hashes(str(train)).records, load_hashes(str(val)).records, 12)
    assert remote == local and len(remote) == 2


def _one_format_per_remote_finish() -> list[str]:
    """One format of each way a remote output is finished (renames, as-is, re-uploaded)."""
    by_finish: dict[str, str] = {}
    for name in format_names():
        how = format_named(name).remote_finish
        if how is not None:
            by_finish.setdefault(how, name)
    return sorted(by_finish.values())


@pytest.mark.parametrize("fmt", _one_format_per_remote_finish())
def test_a_pack_written_to_object_storage_stores_its_hashes(leaky, s3, fmt):
    fs, options = s3
    train, val, _, _ = leaky
    url = f"s3://{BUCKET}/overlap-packed-{fmt}"
    pack_folder(val.parent / "val-src", url, fmt, SPEC, workers=1, storage_options=options)
    pairs = overlap_pairs(load_hashes(str(train)).records, load_hashes(url, options).records, 12)
    assert load_hashes(url, options).stored and len(pairs) == 2
