"""Packs write a seeded permutation of the source: the same bytes for any worker count, engine
and resume; dataset indices without gaps (tar keys included) and a map back to the source."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from packer.scan.source_items import SourceItems
from packer.sources.source import SourceItem, scan_folder
from readers import open_dataset, read_manifest, source_index, source_paths
from readers.formats import format_names
from readers.formats.packed_sample import PreprocessSpec
from readers.order.epoch_order import pack_order
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.formats import numbered_and_not
from tests.support.packrun import SLOW_PACK, copy_source, kill_after_parts, run_pack

SPEC = PreprocessSpec(resize=32)


NUMBERED_AND_NOT = numbered_and_not()


def digest_tree(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` (the manifest without its time and version stamps)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "manifest.json":
            fields = json.loads(data)
            for stamp in ("created", "imgpack_version", "manifest_sha256", "source"):
                fields.pop(stamp, None)
            fields.get("extra", {}).pop("source", None)
            data = json.dumps(fields, sort_keys=True).encode()
        out[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


def with_a_broken_file(dst: Path) -> Path:
    """sample_data plus an undecodable JPEG sorted first, so every later index shifts by one."""
    shutil.copytree(SAMPLE_DATA, dst)
    (dst / "animals" / "000-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return dst


def labels_by_path(src: Path) -> dict[str, int]:
    return {item.rel: item.label for item in scan_folder(src).items}


@pytest.mark.parametrize("fmt", format_names())
def test_default_pack_writes_a_seeded_permutation_that_maps_back_to_the_source(tmp_path, fmt):
    out = tmp_path / fmt
    pack_folder(SAMPLE_DATA, out, fmt, SPEC, workers=1)
    ds = open_dataset(out)
    manifest = read_manifest(out)
    assert manifest.extra["order"] == {"kind": "shuffled", "seed": 0, "paths": "source-paths.nul"}
    paths = source_paths(out)
    by_path = labels_by_path(SAMPLE_DATA)
    assert len(paths) == len(ds) == len(by_path)
    assert [by_path[p] for p in paths] == list(ds.targets)  # targets follow the written order
    assert list(ds.targets) != sorted(ds.targets)
    assert ds.classes == manifest.classes == scan_folder(SAMPLE_DATA).classes
    assert source_index(out)[paths[7]] == 7
    rels = [item.rel for item in scan_folder(SAMPLE_DATA).items]
    assert paths == [rels[i] for i in pack_order(len(rels), "shuffled", 0)]


def test_order_source_keeps_the_source_order_and_the_seed_changes_the_permutation(tmp_path):
    def pack(out: Path, *flags) -> None:
        run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, *flags, "-q", check=True)

    rels = [item.rel for item in scan_folder(SAMPLE_DATA).items]
    pack(tmp_path / "src", "--order", "source")
    assert source_paths(tmp_path / "src") == rels
    assert read_manifest(tmp_path / "src").extra["order"]["kind"] == "source"
    targets = open_dataset(tmp_path / "src").targets
    assert list(targets) == sorted(targets)
    for seed in (0, 1):
        pack(tmp_path / f"s{seed}", "--seed", seed)
    assert source_paths(tmp_path / "s0") != source_paths(tmp_path / "s1")
    assert sorted(source_paths(tmp_path / "s0")) == sorted(rels)


@pytest.mark.parametrize("fmt", NUMBERED_AND_NOT)
def test_workers_and_ray_write_the_same_bytes_and_tar_keys_are_dataset_indices(tmp_path, fmt):
    """A broken file sorted first: a Ray task that cut and numbered its part without knowing that
    skip is written again, and the keys count samples, not source files."""
    import ray
    import webdataset as wds

    src = with_a_broken_file(tmp_path / "src")
    options = {"samples_per_shard": 10}
    outs = {}
    for name, kwargs in {"w1": {"workers": 1}, "w2": {"workers": 2}, "ray": {"engine": "ray"}}.items():
        outs[name] = tmp_path / name
        if name == "ray":
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            report = pack_folder(src, outs[name], fmt, SPEC, options=options, **kwargs)
        finally:
            if name == "ray":
                ray.shutdown()
        assert report.skipped == 1 and report.packed == 44
    trees = [digest_tree(out) for out in outs.values()]
    assert trees[0] == trees[1] == trees[2]
    manifest = read_manifest(outs["w1"])
    firsts = [s.first for s in manifest.shards]
    assert firsts == [0, *np.cumsum([s.count for s in manifest.shards])[:-1].tolist()]  # no gaps
    assert [s.count for s in manifest.shards] == [10, 10, 10, 10, 4]  # cut at dataset indices
    assert "animals/000-broken.jpg" not in source_paths(outs["w1"])
    if fmt == "tar":
        shards = [str(outs["w1"] / s.file) for s in manifest.shards]
        samples = list(wds.WebDataset(shards, shardshuffle=False))
        assert [s["__key__"] for s in samples] == [f"s{i:09d}" for i in range(44)]
        assert [json.loads(s["json"])["path"] for s in samples] == source_paths(outs["w1"])


def test_resume_after_kill_gives_the_output_of_an_uninterrupted_pack(tmp_path):
    src = copy_source(tmp_path / "src", copies=3)
    args = ("--to", "tar", "--samples-per-shard", "12", "--workers", "1", "-q", *SLOW_PACK)
    rc, text = run_pack(src, "-o", tmp_path / "whole", *args)
    assert rc == 0, text
    out = tmp_path / "resumed"
    kill_after_parts(src, out, args)
    rc, text = run_pack(src, "-o", out, *args, "--resume")
    assert rc == 0, text
    assert digest_tree(out) == digest_tree(tmp_path / "whole")


def test_a_reordered_table_reads_pickles_and_slices_like_the_reordered_list():
    items = [SourceItem(i, f"/root/c{i % 3}/f{i}.jpg", f"c{i % 3}/f{i}.jpg", i % 3) for i in range(50)]
    table = SourceItems.from_items(items)
    rows = pack_order(50, "shuffled", 5)
    view = table.reordered(rows)
    expected = [items[i] for i in rows]
    assert list(view) == expected and view[3] == expected[3]
    assert list(view[10:20]) == expected[10:20]
    assert list(pickle.loads(pickle.dumps(view[10:20]))) == expected[10:20]
    assert view.labels().tolist() == [item.label for item in expected]
    assert b"".join(view[5:9].rel_runs()) == b"".join(f"{i.rel}\0".encode() for i in expected[5:9])
    np.testing.assert_array_equal(view.reordered(np.arange(50)[::-1]).labels(), view.labels()[::-1])
    with pytest.raises(ValueError, match="permutation"):
        table.reordered(np.zeros(50, dtype=np.int64))


@pytest.mark.parametrize("fmt", NUMBERED_AND_NOT)
def test_a_pack_to_s3_has_the_same_order_and_source_paths_as_a_local_one(s3, tmp_path, fmt):
    from tests.support.s3server import BUCKET

    _, options = s3
    url = f"s3://{BUCKET}/order-{fmt}"
    pack_folder(
        SAMPLE_DATA, url, fmt, SPEC, workers=1, options={"samples_per_shard": 16}, storage_options=options
    )
    pack_folder(SAMPLE_DATA, tmp_path / "local", fmt, SPEC, workers=1, options={"samples_per_shard": 16})
    assert source_paths(url, options) == source_paths(tmp_path / "local")
    assert read_manifest(url, options).extra["order"]["kind"] == "shuffled"
