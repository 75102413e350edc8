"""Views (readers/views.py, packer/views.py): subsets of a dataset without copies, read like datasets.

Every format from the registry: a view reads exactly its parent's samples at its indices, in
few parent reads; resume, persistent workers, elastic and DDP reads run over the view's own
samples; ``pack verify`` checks the parent parts the view uses and the index file; a re-packed
parent is refused; a hash split is disjoint, covering, deterministic and stable as the dataset
grows; views in and of a bucket read like local ones.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from packer.engine import pack_folder
from packer.preprocess import PreprocessSpec
from packer.verify import verify_dataset
from packer.views import read_index_list, split_views, write_view
from readers import make_loader, mix, open_dataset, open_iterable, source_paths
from readers.errors import ChecksumError, OptionError
from readers.formats import format_names, open_reader
from readers.formats.registry import formats_storing_fields
from readers.manifest import read_manifest
from readers.resume import ResumeError
from readers.views import ViewParentError, ViewReader, check_parent, parent_record
from tests.conftest import SAMPLE_DATA, run_cli
from tests.helpers_formats import parts_hold_the_images

FIXED = {"resize": 40, "crop": 32, "encode": "png"}
FORMAT_SPEC = {"bmp": {**FIXED, "encode": "bmp"}}
PICKED = [0, 1, 2, 3, 9, 10, 17, 18, 19, 25, 31, 40, 43]  # spans the three shards, with runs


def spec_of(fmt: str) -> dict:
    return FORMAT_SPEC.get(fmt, FIXED)


@pytest.fixture(params=format_names())
def parent(request, packed) -> tuple[str, Path]:
    fmt = request.param
    return fmt, packed(fmt, options={"shards": 3}, **spec_of(fmt))


def view_of(parent: Path, out: Path, indices=PICKED) -> Path:
    write_view(parent, out, indices)
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- reading ------------------------------------------------------------------------------------
def test_a_view_reads_the_parents_samples_at_its_indices(parent, tmp_path):
    fmt, root = parent
    view = view_of(root, tmp_path / "view")
    reader, whole = open_reader(view), open_reader(root)
    assert isinstance(reader, ViewReader) and len(reader) == len(PICKED)
    for position, index in enumerate(PICKED):
        a, b = reader.read(position), whole.read(index)
        assert bytes(a.data) == bytes(b.data) and (a.label, a.shape) == (b.label, b.shape)
    assert reader.labels().tolist() == whole.labels()[PICKED].tolist()
    block = reader.read_block(3, 9)
    assert [bytes(r.data) for r in block] == [bytes(whole.read(i).data) for i in PICKED[3:9]]
    ds, full = open_dataset(view), open_dataset(root)
    for position in (0, 6, len(PICKED) - 1):
        image, label = ds[position]
        expected, expected_label = full[PICKED[position]]
        assert np.array_equal(np.asarray(image), np.asarray(expected)) and label == expected_label
    assert ds.classes == full.classes
    # No image bytes in the view: its manifest and 4 bytes an index.
    manifest = read_manifest(view)
    assert manifest.format == "view" and manifest.extra["view"]["parent_format"] == fmt
    assert dir_bytes(view) == (view / "manifest.json").stat().st_size + 4 * len(PICKED)
    assert dir_bytes(view) < 4096 < dir_bytes(root)
    assert str(view) in reader.describe(4) and whole.describe(PICKED[4]) in reader.describe(4)


def test_a_view_of_a_view_names_the_root_dataset(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    first = view_of(root, tmp_path / "first")
    second = view_of(first, tmp_path / "second", [1, 4, 5])
    info = read_manifest(second).extra["view"]
    assert os.path.normpath(tmp_path / "second" / info["parent"]) == os.path.normpath(root)
    reader = open_reader(second)
    assert reader.indices.tolist() == [PICKED[1], PICKED[4], PICKED[5]]
    assert source_paths(second) == [source_paths(root)[i] for i in (PICKED[1], PICKED[4], PICKED[5])]
    assert isinstance(reader.parent, type(open_reader(root)))


def test_consecutive_view_positions_are_read_as_few_parent_blocks(parent, tmp_path):
    from readers.formats import FormatReader

    _, root = parent
    view = view_of(root, tmp_path / "view", list(range(5, 37)))
    it = open_iterable(view, shuffle=False, batch_size=8)
    whole = it.reader.parent
    asked: list[list[int]] = []
    blocks: list[int] = []
    read_many, read_local = whole.read_many, whole.read_local

    def many(indices):
        asked.append(np.asarray(indices).tolist())
        return read_many(indices)

    def local(shard, start, stop):
        blocks.append(stop - start)
        return read_local(shard, start, stop)

    whole.read_many, whole.read_local = many, local
    got = [labels for _, labels in DataLoader(it, batch_size=None)]
    assert sum(len(labels) for labels in got) == 32
    # At most one call of the parent per batch, with whole runs of parent indices, ascending...
    assert len(asked) <= 4 and [i for call in asked for i in call] == list(range(5, 37))
    # ...read as one block per shard it spans, where the format reads by blocks.
    if (
        type(whole).read_local is not FormatReader.read_local
        and type(whole).read_many is FormatReader.read_many
    ):
        assert len(blocks) <= 4 + 2 and sum(blocks) == 32  # 4 batches, at most 2 shard cuts


def test_fields_ride_along(tmp_path):
    from packer.imagelist import scan_list
    from tests.cocodata import draw_rectangles

    (tmp_path / "images").mkdir()
    images = draw_rectangles(tmp_path / "images", 12, 24, 32)
    lines = ["path,label,n,note"] + [f"{i:02d}.png,{i % 2},{i},note {i}" for i in range(12)]
    (images / "list.csv").write_text("\n".join(lines) + "\n")
    for fmt in formats_storing_fields():
        out = tmp_path / fmt
        spec = PreprocessSpec(encode="bmp") if fmt == "bmp" else PreprocessSpec(encode="png")
        pack_folder(scan_list(images / "list.csv", images), out, fmt, spec, workers=1)
        view = view_of(out, tmp_path / f"{fmt}-view", [1, 5, 6, 11])
        got = [open_dataset(view, fields=["n", "note"])[k][1] for k in range(4)]
        whole = open_dataset(out, fields=["n", "note"])
        assert got == [whole[i][1] for i in (1, 5, 6, 11)], fmt
        assert read_manifest(view).fields == read_manifest(out).fields


# -- order and resume ---------------------------------------------------------------------------
def batch_list(it, num_workers: int, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(it, batch_size=None, num_workers=num_workers, **options)
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_resume_mid_epoch_with_workers_is_exact_and_refused_on_another_view(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(0, 44, 2)) + [43])
    it = open_iterable(view, seed=4, batch_size=4, crop=24)
    it.set_epoch(2)
    full = batch_list(it, 2)
    it.set_epoch(2)
    taken = []
    for batch in DataLoader(it, batch_size=None, num_workers=2):
        taken.append(batch)
        if len(taken) == 3:
            break
    state = it.state_dict(consumed=12)
    resumed = open_iterable(view, seed=4, batch_size=4, crop=24)
    resumed.load_state_dict(state)
    rest = batch_list(resumed, 2)
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(full[3:], rest))
    # Persistent workers go on to full epochs after the resumed one.
    it.set_epoch(3)
    epoch3 = batch_list(it, 0)
    again = open_iterable(view, seed=4, batch_size=4, crop=24)
    again.load_state_dict(state)
    loader = make_loader(again, num_workers=2, persistent_workers=True)
    again.set_epoch(2)
    first = [(x.clone(), y.clone()) for x, y in loader]
    again.set_epoch(3)
    second = [(x.clone(), y.clone()) for x, y in loader]
    assert [y.tolist() for _, y in first] == [y.tolist() for _, y in full[3:]]
    assert [y.tolist() for _, y in second] == [y.tolist() for _, y in epoch3]
    # A view of the same size with other samples is another dataset: its states do not apply.
    other = view_of(root, tmp_path / "other", list(range(1, 44, 2)) + [42])
    assert len(open_reader(other)) == len(open_reader(view))
    with pytest.raises(ResumeError, match="dataset"):
        open_iterable(other, seed=4, batch_size=4, crop=24).load_state_dict(state)
    # The order over a view depends on the view's samples only: the same for a copy of it.
    assert read_manifest(other).num_samples == read_manifest(view).num_samples


def test_elastic_resume_from_two_ranks_to_one_reads_each_view_sample_once(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(3, 35)))  # 32 samples
    ids = {bytes(open_reader(view).read(k).data): k for k in range(32)}
    seen, states = [], []
    for rank in (0, 1):
        it = open_iterable(view, seed=9, rank=rank, world_size=2, decode="bytes")
        taken = 0
        for image, _ in it:
            seen.append(ids[bytes(image)])
            taken += 1
            if taken == 8:
                break
        states.append(it.state_dict())
    assert states[0]["position"] == states[1]["position"]
    single = open_iterable(view, seed=9, decode="bytes")
    single.load_state_dict(states[0])
    seen += [ids[bytes(image)] for image, _ in single]
    assert sorted(seen) == list(range(32))


def _rank_main(rank: int, path: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        it = open_iterable(path, seed=11, decode="bytes")
        seen = [bytes(image).hex() for image, _ in DataLoader(it, batch_size=None, num_workers=1)]
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


def test_two_ddp_ranks_read_each_view_sample_once(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(1, 41, 2)))  # 20 samples
    os.environ.pop("RANK", None)
    mp.spawn(_rank_main, args=(str(view), str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    reader = open_reader(view)
    assert len(ranks[0]) == len(ranks[1]) == 10
    assert sorted(ranks[0] + ranks[1]) == sorted(bytes(reader.read(k).data).hex() for k in range(20))


def test_mix_and_dali_loader_read_a_view(packed, tmp_path):
    from readers.dali import dali_loader

    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view")
    labels = sorted(open_reader(view).labels().tolist())
    ds = open_dataset(view, decode="numpy")
    pixels = {np.ascontiguousarray(ds[k][0]).tobytes(): ds[k][1] for k in range(len(ds))}
    from_view = 0
    for images, ys in mix([view, root], batch_size=4, seed=2):
        for image, y in zip(images, ys.tolist()):
            if y < 5:  # dataset 0 of the mix: a sample of the view (the parent's labels are offset)
                assert pixels[image.permute(1, 2, 0).contiguous().numpy().tobytes()] == y
                from_view += 1
    assert from_view > 0
    for device in ("dataloader", "cpu"):
        loader = dali_loader(view, batch_size=len(PICKED), device=device, num_workers=1, device_id=None)
        got = [y.cpu() for _, y in loader]
        assert sorted(torch.cat(got).tolist()) == labels, device


# -- checks -------------------------------------------------------------------------------------
def fresh_parent(tmp_path: Path, fmt: str = "tar", seed: int = 0, force: bool = False) -> Path:
    out = tmp_path / "parent"
    spec = PreprocessSpec(**spec_of(fmt))
    pack_folder(SAMPLE_DATA, out, fmt, spec, workers=1, options={"shards": 3}, seed=seed, force=force)
    return out


@pytest.mark.parametrize("fmt", format_names())
def test_verify_checks_the_parent_parts_the_view_uses_and_its_index_file(fmt, tmp_path):
    root = fresh_parent(tmp_path, fmt)
    reader = open_reader(root)
    used = list(range(reader.manifest.shards[1].first, reader.manifest.shards[1].stop))
    view = view_of(root, tmp_path / "view", used)  # the middle shard only
    report = verify_dataset(view)
    assert report.ok and report.samples == len(used) and report.shards == 1
    unused, middle = (Path(open_reader(root).checksum_path(reader.manifest.shards[k])) for k in (0, 1))
    if parts_hold_the_images(root):  # (the BMP cache's parts are small listings: all checked on open)
        flip(unused)
        assert verify_dataset(view).ok  # a large part the view does not read is not hashed
    flip(middle)
    report = verify_dataset(view)
    assert not report.ok and any(str(middle) in p for p in report.problems)
    flip(middle)
    # A tampered index file: other samples than the manifest checksums.
    index = view / read_manifest(view).shards[0].file
    data = bytearray(index.read_bytes())
    data[0] ^= 1
    index.write_bytes(bytes(data))
    report = verify_dataset(view)
    assert not report.ok and str(index) in report.problems[0]
    with pytest.raises(ChecksumError, match="indices"):
        open_reader(view)


def flip(path: Path) -> None:
    """Flip one byte in the middle of the file (of the largest file of a directory part)."""
    if path.is_dir():
        path = max((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_repacked_or_missing_parent_is_refused_naming_both_paths(tmp_path):
    root = fresh_parent(tmp_path)
    view = view_of(root, tmp_path / "view")
    assert len(open_reader(view)) == len(PICKED)
    fresh_parent(tmp_path, seed=1, force=True)  # the same source in another order, in its place
    with pytest.raises(ViewParentError) as caught:
        open_iterable(view)
    assert str(view) in str(caught.value) and str(root) in str(caught.value)
    assert "re-packed" in str(caught.value)
    shutil.rmtree(root)
    with pytest.raises(ViewParentError, match="does not open"):
        open_reader(view)


def test_a_parent_that_grew_by_new_parts_still_serves_the_view(packed):
    from dataclasses import replace

    manifest = read_manifest(packed("tar", options={"shards": 3}, **FIXED))
    info = parent_record(manifest)
    extra = replace(manifest.shards[-1], file="appended.tar", first=manifest.num_samples, count=5)
    grown = replace(manifest, shards=[*manifest.shards, extra], num_samples=manifest.num_samples + 5,
                    classes=[*manifest.classes, "new class"])  # fmt: skip
    check_parent("view", "parent", info, grown)  # appended: accepted
    changed = replace(manifest.shards[0], sha256="0" * 64)
    repacked = replace(grown, shards=[changed, *grown.shards[1:]])
    with pytest.raises(ViewParentError, match="re-packed"):
        check_parent("view", "parent", info, repacked)
    with pytest.raises(ViewParentError):
        check_parent("view", "parent", info, replace(manifest, classes=manifest.classes[:-1]))


# -- split --------------------------------------------------------------------------------------
def sides(out: Path, parent: Path) -> dict[str, set[str]]:
    paths = source_paths(parent)
    return {s: {paths[i] for i in open_reader(out / s).indices.tolist()} for s in ("train", "val")}


def test_split_is_disjoint_covering_deterministic_and_stable_when_the_dataset_grows(tmp_path, packed):
    small_src = tmp_path / "small"
    for path in sorted(p for p in SAMPLE_DATA.rglob("*") if p.is_file() and p.parent != SAMPLE_DATA)[:30]:
        target = small_src / path.relative_to(SAMPLE_DATA)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    small = tmp_path / "small-ds"
    pack_folder(small_src, small, "lmdb", PreprocessSpec(**FIXED), workers=1)
    big = packed("lmdb", options={"shards": 3}, **FIXED)
    split_views(small, tmp_path / "a", val=0.3, seed=0)
    split_views(big, tmp_path / "b", val=0.3, seed=0)
    a, b = sides(tmp_path / "a", small), sides(tmp_path / "b", big)
    assert not a["train"] & a["val"] and a["train"] | a["val"] == set(source_paths(small))
    assert not b["train"] & b["val"] and len(b["train"] | b["val"]) == 44
    assert a["val"] and a["train"]
    assert b["val"] & a["train"] == set() and a["val"] <= b["val"]  # no sample changed side
    assert a["train"] <= b["train"]
    split_views(big, tmp_path / "again", val=0.3, seed=0)
    for side in ("train", "val"):
        assert (tmp_path / "again" / side / "indices.u32").read_bytes() == (
            tmp_path / "b" / side / "indices.u32"
        ).read_bytes()
    split_views(big, tmp_path / "seed1", val=0.3, seed=1)
    assert sides(tmp_path / "seed1", big)["val"] != b["val"]
    by_index = split_views(big, tmp_path / "index", val=0.3, seed=0, key="index")
    assert by_index["val"].samples + by_index["train"].samples == 44
    with pytest.raises(OptionError, match="already"):
        split_views(big, tmp_path / "b", val=0.3, seed=0)
    with pytest.raises(OptionError, match="between 0 and 1"):
        split_views(big, tmp_path / "c", val=1.5)


# -- the command line ---------------------------------------------------------------------------
def test_cli_view_drop_split_info_verify_show_and_one_line_errors(packed, tmp_path):
    root = packed("tar", options={"shards": 3}, **FIXED)
    drop = tmp_path / "drop.txt"
    drop.write_text("# duplicates found by pack dups\n3\n\n5\n5\n")
    run_cli("view", root, "-o", tmp_path / "kept", "--drop", drop, check=True)
    assert open_reader(tmp_path / "kept").indices.tolist() == [i for i in range(44) if i not in (3, 5)]
    out = run_cli("split", tmp_path / "kept", "--val", "0.25", "--seed", "3", "-o", tmp_path / "sp", "--json",
                  check=True)  # fmt: skip
    made = json.loads(out.stdout)
    assert [Path(r["path"]).name for r in made] == ["train", "val"]
    assert sum(r["samples"] for r in made) == 42 and all(r["parent"] == str(root) for r in made)
    info = run_cli("info", tmp_path / "sp" / "val", check=True).stdout
    assert "view of" in info and "no image bytes" in info
    verified = json.loads(run_cli("verify", tmp_path / "sp" / "val", "--json", check=True).stdout)
    assert verified["ok"] and verified["samples"] == made[1]["samples"]
    run_cli("show", tmp_path / "sp" / "val", "-o", tmp_path / "val.png", "--n", "4", check=True)
    assert (tmp_path / "val.png").stat().st_size > 0
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nthree\n")
    for args, message in (
        (("--indices", bad), f"{bad}:3"),
        (("--indices", drop, "--drop", drop), "exactly one"),
        (("--drop", tmp_path / "big.txt"), "outside"),
    ):
        (tmp_path / "big.txt").write_text("44\n")
        proc = run_cli("view", root, "-o", tmp_path / "v", *args)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_index_lists_take_comments_and_blank_lines_and_name_a_bad_line(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text("# made by pack dups\n\n 7 \n2\n")
    assert read_index_list(path).tolist() == [7, 2]
    path.write_text("1\n-2\n")
    with pytest.raises(OptionError, match=f"{path}:2"):
        read_index_list(path)


# -- remote -------------------------------------------------------------------------------------
def test_views_in_and_of_a_bucket_read_and_verify_like_local_ones(s3, tmp_path):
    from tests.s3server import BUCKET

    _, options = s3
    url = f"s3://{BUCKET}/views/parent"
    pack_folder(SAMPLE_DATA, url, "tar", PreprocessSpec(**FIXED), workers=1, options={"shards": 3},
                storage_options=options)  # fmt: skip
    local = pack_dir = tmp_path / "local-parent"
    pack_folder(SAMPLE_DATA, pack_dir, "tar", PreprocessSpec(**FIXED), workers=1, options={"shards": 3})
    expected = [bytes(open_reader(local).read(i).data) for i in PICKED]
    remote_view = f"s3://{BUCKET}/views/view"
    write_view(url, remote_view, PICKED, storage_options=options)
    assert read_manifest(remote_view, options).extra["view"]["parent"] == "../parent"
    write_view(url, tmp_path / "local-view", PICKED, storage_options=options)
    for view in (remote_view, str(tmp_path / "local-view")):
        reader = open_reader(view, storage_options=options, cache_dir=str(tmp_path / f"cache-{len(view)}"))
        assert [bytes(r.data) for r in reader.read_many(range(len(PICKED)))] == expected
        it = open_iterable(view, storage_options=options, shuffle=False, decode="bytes")
        assert [bytes(image) for image, _ in it] == expected
    assert verify_dataset(remote_view, storage_options=options).ok
    with pytest.raises(OptionError, match="cannot name the local dataset"):
        write_view(local, f"s3://{BUCKET}/views/bad", PICKED, storage_options=options)
