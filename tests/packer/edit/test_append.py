"""``--append``: a dataset grows by new parts (packer/edit/append.py), for every registered format.

The order differs from a fresh pack of the union: a fresh pack shuffles all samples together,
an append keeps the old samples at their indices and shuffles only the new ones after them."""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.edit._append_place import STAGING, RemotePlace
from packer.edit.append import append_to, versioned
from packer.engine.pack_run import pack_folder
from packer.output.output_dir import PROGRESS_NAME
from packer.sources.imagelist import scan_list
from packer.sources.source import scan_folder
from readers import ResumeError, open_iterable, source_paths
from readers.errors import OptionError
from readers.formats import open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import format_named, format_names, formats_storing_fields
from readers.formats.tar.reader import sample_key, split_member
from readers.store.manifest import MANIFEST_NAME, read_manifest
from readers.store.sample_hashes import hashes_of
from readers.store.sample_sources import SOURCE_PATHS_NAME
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.formats import numbered_and_not
from tests.support.packrun import SLOW_PACK, copy_source, kill_group, run_pack, start_pack, wait_for
from tests.support.s3server import BUCKET

SPEC = PreprocessSpec(encode="png")


def images(root: Path, counts: dict[str, int], seed: int, prefix: str = "") -> Path:
    rng = np.random.default_rng(seed)
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{prefix}{i}.png")
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("append-src")
    old = images(base / "old", {"b": 6, "d": 6}, seed=1)
    new = images(base / "new", {"a": 6, "d": 6}, seed=2, prefix="n")  # a new class, a known one
    union = base / "union"
    shutil.copytree(old, union)
    shutil.copytree(new, union, dirs_exist_ok=True)
    return {"old": old, "new": new, "union": union}


def data_files(root: Path) -> dict[Path, bytes]:
    """Every file of a dataset but its manifest and source-path list (both replaced whole)."""
    own = {MANIFEST_NAME, SOURCE_PATHS_NAME}
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name not in own}


def content(root: Path) -> dict[str, tuple[bytes, str]]:
    """{source path: (stored bytes, class name)} of every sample, read with verify=True."""
    reader = open_reader(root, verify=True)
    try:
        classes = reader.manifest.classes
        records = [reader.read(i) for i in range(len(reader))]
        return {rel: (bytes(r.data), classes[r.label]) for rel, r in zip(source_paths(root), records)}
    finally:
        reader.close()


def stored_keys(root: Path) -> list[str]:
    """The sample keys of a dataset whose shards are tar streams (its writer stores indices)."""
    keys: list[str] = []
    for shard in read_manifest(root).shards:
        with tarfile.open(root / shard.file) as tar:
            keys += dict.fromkeys(split_member(name)[0] for name in tar.getnames())
    return keys


@pytest.mark.parametrize("fmt", format_names())
def test_append_reads_as_the_union_and_leaves_version_1_alone(fmt, sources, tmp_path):
    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, fmt, SPEC, workers=1)
    before, old_content = data_files(ds), content(ds)
    old_labels = open_reader(ds).labels().tolist()
    opened = open_reader(ds)  # a reader of version 1, open across the append
    first = [bytes(opened.read(i).data) for i in range(len(opened))]

    report = append_to(ds, scan_folder(sources["new"]), workers=1)

    assert (report.version, report.added, report.new_classes) == (2, 12, ["a"])
    after = data_files(ds)
    assert {p: after[p] for p in before} == before  # old parts byte for byte
    assert not (ds / STAGING).exists()
    assert [bytes(opened.read(i).data) for i in range(len(opened))] == first
    assert len(opened) == 12
    opened.close()
    manifest = read_manifest(ds)
    assert manifest.classes == ["b", "d", "a"]  # existing indices kept, the new name last
    appended = open_reader(ds).labels().tolist()
    assert appended[:12] == old_labels
    assert [h["added"] for h in manifest.extra["history"]] == [12, 12]
    new_rels = source_paths(ds)[12:]
    assert new_rels != sorted(new_rels)  # the pack-time shuffle applied to the new samples

    if format_named(fmt).writer_class().stores_indices:  # the samples' own keys name their dataset index
        assert stored_keys(ds) == [sample_key(i) for i in range(24)]

    fresh = tmp_path / "fresh"
    pack_folder(sources["union"], fresh, fmt, SPEC, workers=1)
    got, want = content(ds), content(fresh)
    assert got == want
    assert {k: got[k] for k in old_content} == old_content
    hashes = hashes_of(ds)  # the hash sidecar grew with the samples, old records first
    assert hashes is not None and len(hashes) == 24
    assert sorted(hashes["digest"].tolist()) == sorted(hashes_of(fresh)["digest"].tolist())

    pack_folder(sources["old"], ds, fmt, SPEC, workers=1, force=True)  # an appended dataset is ours
    assert not [p.name for p in ds.rglob("*~v*")]  # version 2's sidecars went with it
    assert read_manifest(ds).num_samples == 12


@pytest.mark.parametrize("workers", [1, 2])
def test_append_with_dedup_skips_copies_of_the_datasets_samples(sources, tmp_path, workers):
    ds, new = tmp_path / "ds", tmp_path / "new"
    pack_folder(sources["old"], ds, "tar", SPEC, workers=1)
    shutil.copytree(sources["new"], new)
    copied = new / "d" / "copy-of-b0.png"
    shutil.copy(sources["old"] / "b" / "0.png", copied)  # exact: the same stored bytes
    Image.open(sources["old"] / "d" / "1.png").resize((32, 24)).save(new / "a" / "bigger-d1.png")  # near

    report = append_to(ds, scan_folder(new), workers=workers, dedup="near")

    assert report.added == 12
    reasons = {s["path"]: s["reason"] for s in read_manifest(ds).skipped}
    assert reasons["d/copy-of-b0.png"].startswith(f"exact duplicate of b/0.png (in {ds})")
    assert reasons["a/bigger-d1.png"].startswith(f"near duplicate of d/1.png (in {ds}), distance")
    assert len(hashes_of(ds)) == 24


def test_a_second_append_and_the_cli(sources, tmp_path):
    ds = tmp_path / "ds"
    fmt = next(f for f in format_names() if f in formats_storing_fields())
    assert (
        run_cli("imagefolder", sources["old"], "--to", fmt, "-o", ds, "--encode", "png", "-q").returncode == 0
    )
    for version in (2, 3):
        done = run_cli("imagefolder", sources["new"], "-o", ds, "--append", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["version"] == version
    manifest = read_manifest(ds)
    assert manifest.num_samples == 36 and manifest.extra["version"] == 3
    for entry in (v for v in manifest.extra.values() if isinstance(v, dict) and "sha256" in v):
        assert entry["file"] == versioned(entry["file"], 3)
    info = run_cli("info", ds)
    assert "version   3" in info.stdout and "v3 +12" in info.stdout
    assert run_cli("verify", ds).returncode == 0


def test_a_different_option_is_refused_before_anything_is_written(sources, tmp_path):
    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, "lmdb", SPEC, workers=1)
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    with pytest.raises(OptionError, match="--quality 90, not 50"):
        append_to(ds, scan_folder(sources["new"]), {"quality": 50})
    done = run_cli("imagefolder", sources["new"], "-o", ds, "--append", "--resize", "8")
    assert done.returncode == 1 and "--resize" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = run_cli("imagefolder", sources["new"], "-o", ds, "--append", "--to", "tar")
    assert done.returncode == 1 and "lmdb dataset, not --to tar" in done.stderr
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before


def test_a_resume_state_names_its_dataset_version(sources, tmp_path):
    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, "lmdb", SPEC, workers=1)
    it = open_iterable(ds, batch_size=4, shuffle=True, seed=0)
    batches = iter(it)
    next(batches)
    state = it.state_dict()
    assert state["dataset_version"] == 1
    append_to(ds, scan_folder(sources["new"]), workers=1)
    again = open_iterable(ds, batch_size=4, shuffle=True, seed=0)
    with pytest.raises(ResumeError, match="saved on version 1 of the dataset but .* is version 2"):
        again.load_state_dict(state)


def test_an_append_with_fields(tmp_path):
    fmt = next(f for f in format_names() if f in formats_storing_fields())
    pics = images(tmp_path / "pics", {"x": 8}, seed=3)
    names = sorted(p.name for p in (pics / "x").iterdir())

    def listing(name: str, rows: list[str], label: int) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"image": f"x/{r}", "label": label, "caption": f"c {r}"}) + "\n"
                                for r in rows))  # fmt: skip
        return path

    ds = tmp_path / "ds"
    pack_folder(scan_list(listing("a.jsonl", names[:4], 0), pics), ds, fmt, SPEC, workers=1)
    append_to(ds, scan_list(listing("b.jsonl", names[4:], 1), pics), workers=1)
    reader = open_reader(ds, verify=True)
    records = reader.read_block(0, len(reader))
    captions = {rel: r.fields["caption"] for rel, r in zip(source_paths(ds), records)}
    assert captions == {f"x/{n}": f"c {n}" for n in names}
    assert read_manifest(ds).field_counts == {"caption": 8}


@pytest.mark.parametrize("fmt", numbered_and_not())
def test_kill_9_of_an_append_then_resume_gives_the_same_bytes(fmt, tmp_path):
    ds, clean = tmp_path / "ds", tmp_path / "clean"
    code, log = run_pack(SAMPLE_DATA, "--to", fmt, "-o", ds, *SLOW_PACK, "--workers", "1", "-q")
    assert code == 0, log
    shutil.copytree(ds, clean)
    new = copy_source(tmp_path / "new")
    args = ("-o", ds, "--append", "--shards", "3", "--workers", "1", "-q")
    proc = start_pack(new, *args)
    progress = ds / STAGING / PROGRESS_NAME
    wait_for(progress, proc)
    while proc.poll() is None and not json.loads(progress.read_text() or "{}").get("parts"):
        time.sleep(0.02)
    kill_group(proc.pid)
    proc.wait()
    assert (ds / STAGING).exists() and read_manifest(ds) == read_manifest(clean)  # still version 1
    code, log = run_pack(new, *args)
    assert code == 1 and "--resume" in log  # an interrupted append is not silently restarted
    code, log = run_pack(new, *args, "--resume")
    assert code == 0, log
    code, log = run_pack(new, "-o", clean, "--append", "--shards", "3", "--workers", "1", "-q")
    assert code == 0, log
    assert [p.relative_to(ds) for p in data_files(ds)] == [p.relative_to(clean) for p in data_files(clean)]
    assert list(data_files(ds).values()) == list(data_files(clean).values())
    assert content(ds) == content(clean)
    assert (ds / SOURCE_PATHS_NAME).read_bytes() == (clean / SOURCE_PATHS_NAME).read_bytes()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("fmt", numbered_and_not()[:1])
def test_an_append_with_the_ray_engine_equals_a_local_one(fmt, sources, tmp_path):
    local, ray = tmp_path / "local", tmp_path / "ray"
    pack_folder(sources["old"], local, fmt, SPEC, workers=1)
    shutil.copytree(local, ray)
    append_to(local, scan_folder(sources["new"]), options={"shards": 2}, workers=1)
    append_to(ray, scan_folder(sources["new"]), options={"shards": 2}, engine="ray")
    assert list(data_files(ray).values()) == list(data_files(local).values())
    assert content(ray) == content(local)


@pytest.mark.parametrize("fmt", numbered_and_not()[:1])
def test_an_append_to_an_s3_dataset_equals_a_local_one(fmt, sources, s3, tmp_path):
    fs, options = s3
    local, url = tmp_path / "local", f"s3://{BUCKET}/grow-{fmt}"
    pack_folder(sources["old"], local, fmt, SPEC, workers=1)
    pack_folder(sources["old"], url, fmt, SPEC, workers=1, storage_options=options)
    before = {p: fs.cat_file(p) for p in fs.find(url.removeprefix("s3://")) if not p.endswith(MANIFEST_NAME)}
    append_to(local, scan_folder(sources["new"]), workers=1)
    report = append_to(url, scan_folder(sources["new"]), workers=1, storage_options=options)
    assert report.version == 2
    assert {p: fs.cat_file(p) for p in before if not p.endswith(SOURCE_PATHS_NAME)} == {
        p: b for p, b in before.items() if not p.endswith(SOURCE_PATHS_NAME)
    }
    copy = tmp_path / "copy"
    fs.get(url.removeprefix("s3://") + "/", str(copy) + "/", recursive=True)
    assert list(data_files(copy).values()) == list(data_files(local).values())
    assert content(copy) == content(local)


def test_kill_9_of_an_append_to_s3_then_resume(sources, s3, tmp_path):
    fs, options = s3
    fmt = numbered_and_not()[0]
    spec = PreprocessSpec(resize=256, encode="png", upscale=True)  # slow enough to interrupt
    url, local = f"s3://{BUCKET}/grow-kill", tmp_path / "local"
    for out in (url, local):
        pack_folder(sources["old"], out, fmt, spec, workers=1, storage_options=options)
    new = copy_source(tmp_path / "new")
    args = ("-o", url, "--append", "--shards", "3", "--workers", "1", "-q")
    args += ("--storage-options", json.dumps(options))
    proc = start_pack(new, *args)
    progress = RemotePlace(url, options).staging / PROGRESS_NAME
    wait_for(progress, proc)
    while proc.poll() is None and not json.loads(progress.read_text() or "{}").get("parts"):
        time.sleep(0.02)
    kill_group(proc.pid)
    proc.wait()
    assert progress.exists() and read_manifest(url, options).num_samples == 12  # still version 1
    code, log = run_pack(new, *args, "--resume")
    assert code == 0, log
    append_to(local, scan_folder(new), options={"shards": 3}, workers=1)
    copy = tmp_path / "copy"
    fs.get(url.removeprefix("s3://") + "/", str(copy) + "/", recursive=True)
    assert list(data_files(copy).values()) == list(data_files(local).values())
    assert content(copy) == content(local)


@pytest.mark.parametrize("fmt", format_names())
def test_appending_files_of_the_same_names_keeps_both(fmt, sources, tmp_path):
    """A re-scraped batch holds names the dataset has (``d/0.png``): both samples stay readable."""
    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, fmt, SPEC, workers=1)
    append_to(ds, scan_folder(sources["old"]), workers=1)
    reader = open_reader(ds, verify=True)
    stored = [bytes(reader.read(i).data) for i in range(len(reader))]
    assert len(stored) == 24 and sorted(stored[:12]) == sorted(stored[12:])
    assert sorted(source_paths(ds)[:12]) == sorted(source_paths(ds)[12:])


def test_an_append_killed_after_its_manifest_resumes_to_the_same_version(sources, tmp_path, monkeypatch):
    import packer.edit.append

    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, "lmdb", SPEC, workers=1)

    def killed(path: Path) -> None:
        raise KeyboardInterrupt  # the moment between the manifest and the staging folder's removal

    monkeypatch.setattr(packer.edit.append.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        append_to(ds, scan_folder(sources["new"]), workers=1)
    monkeypatch.undo()
    written = (ds / MANIFEST_NAME).read_bytes()
    report = append_to(ds, scan_folder(sources["new"]), workers=1, resume=True)
    assert (report.version, report.new_classes) == (2, ["a"])
    assert (ds / MANIFEST_NAME).read_bytes() == written and not (ds / STAGING).exists()


def test_views_and_splits_of_a_dataset_read_on_across_its_append(sources, tmp_path):
    from packer.edit.views import split_views, write_view

    ds = tmp_path / "ds"
    pack_folder(sources["old"], ds, "tar", SPEC, workers=1)
    write_view(ds, tmp_path / "view", [1, 4, 7])
    split_views(ds, tmp_path / "before", val=0.3, seed=0)
    first = content(tmp_path / "view")

    append_to(ds, scan_folder(sources["new"]), workers=1)

    assert content(tmp_path / "view") == first  # old indices keep their samples
    split_views(ds, tmp_path / "after", val=0.3, seed=0)
    sides = {}
    for when in ("before", "after"):
        sides[when] = {side: set(source_paths(tmp_path / when / side)) for side in ("train", "val")}
    old = sides["before"]["train"] | sides["before"]["val"]
    assert sides["before"]["val"] and len(old) == 12
    for side in ("train", "val"):  # an old sample stays on its side; new ones join either
        assert sides["after"][side] & old == sides["before"][side]
