"""Per-sample hashes stored by every format, --dedup at pack time, pack dups, the planted recall."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.bench.planted import KINDS, planted
from packer.dedup.deduper import DEFAULT_NEAR_DISTANCE
from packer.dedup.overlap import load_hashes, read_indices
from packer.engine.pack_run import pack_folder
from packer.info.verify import verify_dataset
from packer.transform.preprocess import preprocess_file
from readers import read_manifest, source_paths
from readers.formats import format_names, open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.image.decode import decode_array
from readers.store.manifest import write_manifest
from readers.store.sample_hashes import digest_of, phash_of_array, stored_hashes
from tests.conftest import run_cli
from tests.support.dedup import planted_folder

SPEC = PreprocessSpec(resize=48)


@pytest.mark.parametrize("fmt", format_names())
def test_every_format_stores_its_hashes_and_verify_checks_them(fmt, packed, tmp_path):
    ds = packed(fmt, resize=64)
    entry = read_manifest(ds).extra["hashes"]
    reader = open_reader(ds)
    try:
        records = stored_hashes(reader)
        assert records is not None and len(records) == len(reader)
        for i in range(len(reader)):
            record = reader.read(i)
            assert bytes(records[i]["digest"]) == digest_of(bytes(record.data)), i
            # hashed from the pixels before encoding: the decoded ones differ by the codec's loss
            assert (int(records[i]["phash"]) ^ phash_of_array(decode_array(record))).bit_count() <= 4, i
    finally:
        reader.close()
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    sidecar = copy / entry["file"]
    data = bytearray(sidecar.read_bytes())
    data[3] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    report = verify_dataset(copy, decode=False)
    assert not report.ok and any("hash file" in p for p in report.problems), report.problems


def _kept_and_skipped(out: Path) -> tuple[list[str], dict[str, str]]:
    manifest = read_manifest(out)
    return list(source_paths(out)), {s["path"]: s["reason"] for s in manifest.skipped}


def _check_planted(copies: dict[str, str], kept: list[str], skipped: dict[str, str], mode: str) -> None:
    for copy, original in copies.items():
        near = copy.endswith("near_copy.jpg")
        if near and mode == "exact":
            assert copy in kept and original in kept
            continue
        # the first of the two in the pack order is kept, the other names it
        pair = {copy, original}
        (kept_one,) = pair & set(kept)
        (dropped,) = pair - {kept_one}
        kind = "near" if near else "exact"
        assert skipped[dropped].startswith(f"{kind} duplicate of {kept_one}"), skipped
        if near:
            assert 0 < int(skipped[dropped].rsplit(" ", 1)[1]) <= DEFAULT_NEAR_DISTANCE


@pytest.mark.parametrize("mode", ["exact", "near"])
def test_dedup_skips_planted_copies_the_same_for_any_worker_count(mode, tmp_path):
    src = tmp_path / "src"
    copies = planted_folder(src, range(12))
    results = []
    for workers in (1, 2):
        out = tmp_path / f"out-{workers}"
        pack_folder(src, out, "tar", SPEC, workers=workers, dedup=mode, options={"samples_per_shard": 5})
        results.append(_kept_and_skipped(out))
        assert read_manifest(out).extra["dedup"]["mode"] == mode
    assert results[0] == results[1]
    kept, skipped = results[0]
    _check_planted(copies, kept, skipped, mode)
    assert len(kept) == 14 - (2 if mode == "near" else 1)


def test_without_dedup_every_copy_is_packed(tmp_path):
    src = tmp_path / "src"
    planted_folder(src, range(6))
    out = tmp_path / "out"
    pack_folder(src, out, "lmdb", SPEC, workers=1)
    assert read_manifest(out).num_samples == 8 and not read_manifest(out).skipped


def test_planted_recall_and_false_pairs_at_the_default_distance():
    """The pack's own hashing (preprocess_file) of a small planted set: every kind of edit."""
    spec = PreprocessSpec(resize=128)
    ids, copies, hashes = [], [], []
    for image_id, copy, data, _ in planted(30, KINDS, seed=1):
        sample = preprocess_file("planted.jpg", "planted.jpg", 0, 0, spec, data)
        ids.append(image_id), copies.append(copy), hashes.append(sample.phash)
    h, ids_a, copies_a = np.asarray(hashes, dtype=np.uint64), np.asarray(ids), np.asarray(copies)
    originals = h[copies_a == 0]
    to_original = np.bitwise_count(h[copies_a > 0] ^ originals[ids_a[copies_a > 0]])
    recall = float((to_original <= DEFAULT_NEAR_DISTANCE).mean())
    upper = np.triu_indices(len(originals), 1)
    between = np.bitwise_count(originals[:, None] ^ originals[None, :])[upper]
    false_rate = float((between <= DEFAULT_NEAR_DISTANCE).mean())
    assert recall >= 0.95, recall
    assert false_rate <= 0.005, false_rate  # 435 distinct pairs: at most 2
    assert np.median(between) > 3 * DEFAULT_NEAR_DISTANCE / 2  # distinct images are far apart


def _strip_hashes(ds: Path) -> None:
    """Make ``ds`` a pack of before hashes were stored: no entry, no sidecar."""
    manifest = read_manifest(ds)
    name = manifest.extra.pop("hashes")["file"]
    (ds / name).unlink()
    write_manifest(ds, manifest)


def test_pack_dups_of_an_old_pack_hashes_it_on_the_fly(tmp_path):
    src = tmp_path / "src"
    copies = planted_folder(src, range(10))
    ds = tmp_path / "ds"
    pack_folder(src, ds, "lmdb", SPEC, workers=1, order="source")
    stored = load_hashes(str(ds))
    _strip_hashes(ds)
    computed = load_hashes(str(ds))
    assert stored.stored and not computed.stored
    assert (stored.records["digest"] == computed.records["digest"]).all()
    indices = tmp_path / "dups.txt"
    proc = run_cli("dups", ds, "--json", "--indices-out", indices)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hashes"] == "computed"
    paths = list(source_paths(ds))
    planted_groups = sorted(sorted([paths.index(c), paths.index(o)]) for c, o in copies.items())
    assert all(g in result["groups"] for g in planted_groups), result["groups"]
    listed = read_indices(indices)
    assert indices.read_text().startswith("#")
    assert sorted(listed) == sorted(i for g in result["groups"] for i in g[1:])
    assert {max(g) for g in planted_groups} <= set(listed)


@pytest.mark.ray
@pytest.mark.slow
def test_dedup_with_ray_keeps_the_copies_the_local_engine_keeps(tmp_path):
    src = tmp_path / "src"
    planted_folder(src, range(12))
    outs = []
    for engine in ("local", "ray"):
        out = tmp_path / engine
        options = {"samples_per_shard": 4}
        pack_folder(src, out, "tar", SPEC, workers=2, engine=engine, dedup="near", options=options)
        outs.append(_kept_and_skipped(out))
    assert outs[0] == outs[1]
    assert len(outs[0][1]) == 2


def test_dedup_options_are_checked_before_anything_is_written(tmp_path):
    proc = run_cli("imagefolder", tmp_path, "--to", "lmdb", "-o", tmp_path / "out", "--near-distance", "5")
    assert proc.returncode == 1 and "--near-distance needs --dedup near" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_dedup_after_kill_9_and_resume_skips_what_an_uninterrupted_pack_skips(tmp_path):
    from tests.support.packrun import SLOW_PACK, kill_after_parts, run_pack

    src = tmp_path / "src"
    planted_folder(src, range(40))
    (src / "dupes").mkdir()
    for k in range(12):  # copies spread over the pack order: some across the kill
        shutil.copyfile(src / f"c{k % 2}" / f"s{k}.jpg", src / "dupes" / f"{k}.jpg")
    args = ("--to", "tar", "--samples-per-shard", "6", "--workers", "2", "--dedup", "near", *SLOW_PACK)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_pack(src, "-o", whole, *args)[0] == 0
    kill_after_parts(src, resumed, args, parts=2)
    code, output = run_pack(src, "-o", resumed, *args, "--resume")
    assert code == 0, output
    assert _kept_and_skipped(resumed) == _kept_and_skipped(whole)
    assert len(_kept_and_skipped(whole)[1]) == 14
