"""Views, checked: ``pack verify`` over the parent parts a view uses and its index file, a
re-packed or grown parent, the hash split, the command line and views in a bucket."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packer.edit.views import read_index_list, split_views, write_view
from packer.engine.pack_run import pack_folder
from packer.info.verify import verify_dataset
from readers import open_iterable, source_paths
from readers.datasets.views import ViewParentError, check_parent, parent_record
from readers.errors import ChecksumError, ImgpackError, OptionError
from readers.formats import format_names, open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.formats import parts_hold_the_images
from tests.support.views import FIXED, PICKED, fresh_parent, view_of


# -- checks -------------------------------------------------------------------------------------
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


def test_a_view_whose_classes_are_not_its_parents_is_refused(packed, tmp_path):
    root = packed("tar", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view")
    manifest = read_manifest(view)
    manifest.classes = list(reversed(manifest.classes))
    (view / "manifest.json").write_text(manifest.to_json())  # edited and resealed
    with pytest.raises(ViewParentError, match="classes"):
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
    from tests.support.s3server import BUCKET

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


EDITS = {
    "no view record": lambda m: m.extra.pop("view"),
    "unknown index dtype": lambda m: m.extra["view"].update(dtype="<i2"),
    "count not a number": lambda m: m.extra["view"].update(parent_num_samples="44"),
    "no parent": lambda m: m.extra["view"].update(parent=""),
    "parent elsewhere": lambda m: m.extra["view"].update(parent="../no-such-dataset"),
    "index size": lambda m: setattr(m.shards[0], "bytes", m.shards[0].bytes + 4),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_view_manifest_is_a_clear_error(packed, tmp_path, edit):
    view = view_of(packed("tar", options={"shards": 3}, **FIXED), tmp_path / "view")
    manifest = read_manifest(view)
    EDITS[edit](manifest)
    (view / "manifest.json").write_text(manifest.to_json())  # edited and resealed
    with pytest.raises(ImgpackError, match=str(view)):
        open_reader(view)


def test_an_index_file_linked_out_of_the_view_is_refused(packed, tmp_path):
    view = view_of(packed("tar", options={"shards": 3}, **FIXED), tmp_path / "view")
    index = view / "indices.u32"
    outside = tmp_path / "elsewhere.u32"
    outside.write_bytes(index.read_bytes())
    index.unlink()
    index.symlink_to(outside)
    with pytest.raises(ImgpackError, match="outside"):
        open_reader(view)
