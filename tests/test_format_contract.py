"""The contract every format keeps, run for every registered format and for one defined in a test.

Like torchvision's ``DatasetTestCase``: one set of generic checks, parametrized by the registry,
so a new format gets them all by registering itself. ``npy`` (tests/npyformat.py) is a format
that imgpack does not ship: registered for the test (in this process, and through
``IMGPACK_FORMATS`` for the ``pack`` subprocesses), it passes the same suite unchanged: its
registry entry, pack, ``--force`` (local and in a bucket), ``--resume`` after a kill, verify,
corruption detected, the remote round trip and every reading path.
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.engine import pack_folder
from packer.output import foreign_entries
from packer.reindex import reindex
from packer.source import scan_folder
from packer.verify import verify_dataset
from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ImgpackError, ManifestError
from readers.formats import format_named, format_names, open_reader, register_format, unregister_format
from readers.formats.base import FormatReader
from readers.formats.format import COMMON_READER_OPTIONS
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import PLUGINS_ENV, open_writer
from readers.manifest import read_manifest
from tests import npyformat
from tests.conftest import SAMPLE_DATA, run_cli
from tests.helpers_damage import edit_manifest, flip_byte
from tests.packrun import (
    SLOW_PACK,
    copy_source,
    dataset_arrays,
    kill_group,
    leftovers,
    run_pack,
    start_pack,
    wait_started,
)
from tests.s3server import BUCKET

FORMATS = list(dict.fromkeys([*format_names(), npyformat.FORMAT.name]))  # shipped ones, then the test's
SPLIT = {"samples_per_shard": 20}  # 44 samples: shards of 20, 20, 4
LOSSLESS = {"resize": 40, "crop": 32, "encode": "png"}


def spec_for(fmt: str) -> dict:
    """LOSSLESS, in the format's own encoding where it stores one only (bmp)."""
    encodings = format_named(fmt).encodings
    return {**LOSSLESS, "encode": "png" if "png" in encodings else encodings[0]}


@pytest.fixture(params=FORMATS)
def fmt(request, monkeypatch) -> str:
    """A format name; the test-defined one is registered for the test's duration only."""
    if request.param == npyformat.FORMAT.name:
        register_format(npyformat.FORMAT, replace=True)
        monkeypatch.setenv(PLUGINS_ENV, npyformat.PLUGIN)  # for `pack` subprocesses
        request.addfinalizer(lambda: unregister_format(npyformat.FORMAT.name))
    return request.param


@pytest.fixture
def small(fmt, packed) -> Path:
    """sample_data packed losslessly in three shards (cached for the session)."""
    return packed(fmt, options=SPLIT, **spec_for(fmt))


def copy_of(path: Path, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(path, root, symlinks=True)
    return root


def stored(path: str | Path, **options) -> list[tuple[bytes, int]]:
    reader = open_reader(path, **options)
    return [(bytes(r.data), r.label) for r in reader.read_block(0, len(reader))]


# -- the registry entry -------------------------------------------------------------------------
def test_registry_entry_describes_the_format(fmt, small, tmp_path):
    entry = format_named(fmt)
    writer = open_writer(fmt, tmp_path / "out", PreprocessSpec(**spec_for(fmt)), {})
    assert writer.format is entry and writer.name == fmt  # handed its Format, never looked up
    assert not {"name"} & (vars(entry.writer_class()).keys() | vars(entry.reader_class()).keys())
    reader_init = inspect.signature(entry.reader_class().__init__).parameters
    common = inspect.signature(FormatReader.__init__).parameters
    own = {n for n, p in reader_init.items() if n not in common and p.kind is not p.VAR_KEYWORD}
    assert set(entry.reader_options) == own  # declared options are exactly the reader's own
    assert set(COMMON_READER_OPTIONS) < set(common)
    assert entry.remote_finish in ("rename", "as-is", "local")
    assert read_manifest(small).format == fmt
    assert foreign_entries(small) == []  # every file a pack writes is one the format declares


def test_an_unknown_format_is_one_clear_error(tmp_path):
    known = ", ".join(format_names())
    with pytest.raises(ImgpackError, match=f"unknown format 'nope'; choose one of {known}"):
        pack_folder(SAMPLE_DATA, tmp_path / "x", "nope")


# -- pack, --force ------------------------------------------------------------------------------
def test_force_replaces_our_dataset_but_not_a_stranger_in_it(fmt, tmp_path):
    out = tmp_path / "ds"
    pack_folder(SAMPLE_DATA, out, fmt, PreprocessSpec(resize=32), workers=1)
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--force", "-q")
    assert proc.returncode == 0, proc.stderr  # everything in it is ours
    assert open_dataset(out).manifest.preprocess["resize"] == 24
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ImgpackError, match=r"not an imgpack output \(it holds notes\.txt\)"):
        pack_folder(SAMPLE_DATA, out, fmt, PreprocessSpec(resize=32), workers=1, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert open_dataset(out).manifest.preprocess["resize"] == 24  # untouched


@pytest.mark.slow
def test_kill_mid_pack_leaves_an_output_that_resume_and_force_finish(fmt, tmp_path):
    """kill -9 in the middle of the first part, then --resume; again, then --force."""
    # A format that stores raw pixels packs several times faster than PNG: give it more to do,
    # so the kill lands mid-pack.
    copies = 2 if "png" in format_named(fmt).encodings else 6
    src = copy_source(tmp_path / "src", copies=copies)
    args = ("--to", fmt, "--workers", "1", "-q", *SLOW_PACK)
    finished = []
    for finish in ("--resume", "--force"):
        out = tmp_path / f"ds{finish}"
        proc = start_pack(src, "-o", out, *args)
        wait_started(out, proc)
        time.sleep(0.5)
        kill_group(proc.pid)
        assert proc.wait() == -signal.SIGKILL
        with pytest.raises(ManifestError, match="--resume"):
            open_dataset(out)
        rc, text = run_pack(src, "-o", out, *args, finish)
        assert rc == 0, f"{finish}: {text}"
        assert verify_dataset(out).ok
        assert leftovers(out) == [] and not (out / ".imgpack-progress.json").exists()
        finished.append(dataset_arrays(out))
    assert finished[0] == finished[1] and len(finished[0]) == len(scan_folder(src).items)


# -- verify and damage --------------------------------------------------------------------------
def test_verify_passes_and_a_flipped_byte_in_any_part_is_caught(fmt, small, tmp_path):
    assert verify_dataset(small).ok
    assert run_cli("verify", small).returncode == 0
    root = copy_of(small, tmp_path)
    reader = open_reader(root)
    damaged = Path(reader.checksum_path(reader.manifest.shards[1]))
    flip_byte(damaged, damaged.stat().st_size // 2)
    report = verify_dataset(root)
    assert not report.ok and damaged.name in "\n".join(report.problems)
    with pytest.raises(ChecksumError, match=damaged.name):
        open_reader(root, verify=True).read_block(0, len(reader))


def test_count_against_what_the_part_holds(fmt, small, tmp_path):
    root = copy_of(small, tmp_path)
    edit_manifest(root, lambda m: (m["shards"][2].update(count=2), m.update(num_samples=42)))
    with pytest.raises(ManifestError, match="manifest (says )?2"):  # tfrecord: "the manifest 2"
        open_reader(root).read_block(0, 42)
    assert not verify_dataset(root).ok


def test_labels_outside_the_classes_are_refused(fmt, small, tmp_path):
    root = copy_of(small, tmp_path)
    edit_manifest(root, lambda m: m.update(classes=m["classes"][:2]))
    with pytest.raises(ManifestError, match="outside the 2 classes"):
        open_reader(root).read_block(0, 44)
    assert "outside the 2 classes" in "\n".join(verify_dataset(root).problems)


def test_edited_manifest_is_caught_by_verify(fmt, small, tmp_path):
    root = copy_of(small, tmp_path)
    edit_manifest(root, lambda m: m["classes"].__setitem__(0, "renamed"), reseal_manifest=False)
    assert open_dataset(root).classes[0] == "renamed"  # a deliberate edit reads without verify
    with pytest.raises(ChecksumError, match="manifest.json: does not match its manifest_sha256"):
        open_reader(root, verify=True)
    assert "manifest_sha256" in "\n".join(verify_dataset(root).problems)


# -- object storage -----------------------------------------------------------------------------
@pytest.mark.remote
def test_pack_into_a_bucket_reads_back_equal_and_force_replaces_it(fmt, small, s3, tmp_path):
    fs, options = s3
    url = f"s3://{BUCKET}/contract-{fmt}"
    spec = PreprocessSpec(**spec_for(fmt))
    pack_folder(SAMPLE_DATA, url, fmt, spec, workers=1, options=SPLIT, storage_options=options)
    assert stored(url, storage_options=options, cache_dir=tmp_path / "cache") == stored(small)
    assert verify_dataset(url, storage_options=options).ok
    fs.pipe_file(f"{BUCKET}/contract-{fmt}/notes.txt", b"mine")
    with pytest.raises(ImgpackError, match=r"not an imgpack output \(it holds notes\.txt\)"):
        pack_folder(SAMPLE_DATA, url, fmt, spec, workers=1, force=True, storage_options=options)
    fs.rm_file(f"{BUCKET}/contract-{fmt}/notes.txt")
    resized = PreprocessSpec(**{**spec_for(fmt), "resize": 36})
    pack_folder(SAMPLE_DATA, url, fmt, resized, workers=1, force=True, storage_options=options)
    assert open_dataset(url, storage_options=options).manifest.preprocess["resize"] == 36


# -- every reading path -------------------------------------------------------------------------
def test_every_reading_path_returns_the_stored_samples(fmt, small):
    ds = open_dataset(small, decode="numpy")
    want = [(np.asarray(image), int(label)) for image, label in ds]
    assert len(want) == 44 and sorted({label for _, label in want}) == list(range(len(ds.classes)))
    mapped = DataLoader(ds, batch_size=None, num_workers=2)
    assert all(np.array_equal(a, np.asarray(b)) and la == int(lb) for (a, la), (b, lb) in zip(want, mapped))
    samples = open_iterable(small, shuffle=False, decode="numpy")
    got = [(np.asarray(x), int(y)) for x, y in DataLoader(samples, batch_size=None, num_workers=2)]
    assert len(got) == 44 and all(np.array_equal(a, b) and la == lb for (a, la), (b, lb) in zip(want, got))
    batches = open_iterable(small, shuffle=False, batch_size=8)
    loader = DataLoader(batches, batch_size=None, num_workers=2)
    images, labels = zip(*[(x.clone(), y.clone()) for x, y in loader])
    stacked = torch.cat(images).permute(0, 2, 3, 1).numpy()  # (N, C, H, W) batches -> (N, H, W, C)
    assert stacked.shape[0] == 44 and np.array_equal(stacked, np.stack([image for image, _ in want]))
    assert torch.cat(labels).tolist() == [label for _, label in want]


def test_a_format_stores_only_the_encodings_it_declares(tmp_path):
    lossless = dataclasses.replace(npyformat.FORMAT, encodings=("png", "raw"))
    register_format(lossless, replace=True)
    try:
        with pytest.raises(ImgpackError, match="--to npy does not store --encode jpeg; use one of png, raw"):
            pack_folder(SAMPLE_DATA, tmp_path / "a", "npy", PreprocessSpec(encode="jpeg"), workers=1)
        assert not (tmp_path / "a").exists()  # refused before anything was written
    finally:
        unregister_format("npy")
    pinned = [f for f in format_names() if len(format_named(f).encodings) == 1]
    for fmt in pinned:  # a format storing one encoding takes it whatever --encode says
        pack_folder(SAMPLE_DATA, tmp_path / fmt, fmt, PreprocessSpec(resize=16, encode="jpeg"), workers=1)
        assert read_manifest(tmp_path / fmt).encoding == format_named(fmt).encodings[0]
    assert pinned  # bmp


def test_reindex_rebuilds_the_shard_indexes_or_says_the_format_keeps_none(fmt, small, tmp_path):
    root = copy_of(small, tmp_path)
    if format_named(fmt).indexer is None:
        indexed = " and ".join(f for f in format_names() if format_named(f).indexer)
        expected = f"is a {fmt} dataset; only {indexed} datasets have .idx files"
        with pytest.raises(ImgpackError, match=expected):
            reindex(root)
        return
    indexes = sorted(root.glob("*.idx"))
    original = [p.read_bytes() for p in indexes]
    for path in indexes:
        path.unlink()
    assert sorted(reindex(root)) == [str(p) for p in indexes]
    assert [p.read_bytes() for p in indexes] == original and verify_dataset(root).ok


# -- per-sample fields (issue 23) ----------------------------------------------------------------
FIELD_SCHEMA = {
    "caption": "str", "score": "float", "boxes": "boxes", "categories": "box_ints", "meta": "json"
}  # fmt: skip


def field_rows() -> list:
    """sample_data's images as rows with fields; every third without a single class (label -1)."""
    from packer.rows import Row

    files = sorted(p for p in SAMPLE_DATA.rglob("*.jpg"))[:12]
    rows = []
    for i, path in enumerate(files):
        boxes = [[1.5 * k, 2.0, 10.0 + k, 8.0] for k in range(i % 4)]
        fields = {"caption": f"café n°{i}", "score": i / 4, "boxes": boxes}
        fields["categories"] = list(range(i % 4))
        if i % 2:
            fields["meta"] = {"url": f"http://x/{i}", "tags": ["a", i]}
        rows.append(Row(str(path.relative_to(SAMPLE_DATA)), -1 if i % 3 == 0 else i % 2, fields, f"row {i}"))
    return rows


def test_fields_round_trip_in_every_format_that_stores_them_or_one_clear_refusal(fmt, tmp_path):
    from PIL import Image, ImageOps

    from packer.box_geometry import pack_geometry
    from packer.rows import pack_rows
    from readers.boxes import transform_boxes

    rows, out = field_rows(), tmp_path / "fields"
    spec = PreprocessSpec(**spec_for(fmt))
    if not format_named(fmt).stores_fields:
        with pytest.raises(ImgpackError, match=f"--to {fmt} does not store per-sample fields.*--no-fields"):
            pack_rows(rows, SAMPLE_DATA, ["even", "odd"], out, fmt, FIELD_SCHEMA, spec=spec, workers=1)
        return
    pack_rows(rows, SAMPLE_DATA, ["even", "odd"], out, fmt, FIELD_SCHEMA, spec=spec, workers=1,
              options={"samples_per_shard": 5}, order="source")  # fmt: skip
    manifest = read_manifest(out)
    assert manifest.fields == FIELD_SCHEMA
    assert manifest.field_counts == {"caption": 12, "score": 12, "boxes": 12, "categories": 12, "meta": 6}
    assert verify_dataset(out).ok
    ds = open_dataset(out, fields=list(FIELD_SCHEMA), verify=True)
    assert len(ds) == len(rows)
    for i, row in enumerate(rows):  # samples keep the rows' order
        _, target = ds[i]
        assert target["label"] == row.label
        assert target["caption"] == row.fields["caption"] and target["score"] == row.fields["score"]
        # boxes are stored in the stored image's pixels: moved by the pack's --resize/--crop
        with Image.open(SAMPLE_DATA / row.path) as source:
            geometry = pack_geometry(ImageOps.exif_transpose(source).size, spec)
        expected, kept = transform_boxes(np.asarray(row.fields["boxes"], np.float32), geometry)
        assert target["boxes"].dtype == np.float32 and target["boxes"].shape == expected.shape
        np.testing.assert_allclose(target["boxes"], expected, atol=1e-4)
        np.testing.assert_array_equal(target["categories"], np.asarray(row.fields["categories"])[kept])
        assert target["meta"] == row.fields.get("meta")
    assert open_dataset(out)[4][1] == rows[4].label  # without fields=: the label, as always
    with pytest.raises(ImgpackError, match="no field 'nope'"):
        open_dataset(out, fields=["nope"])


@pytest.mark.remote
def test_fields_are_packed_into_a_bucket_and_read_back_by_url(fmt, s3, tmp_path):
    from packer.rows import pack_rows

    fs, options = s3
    url = f"s3://{BUCKET}/fields-{fmt}"
    rows = field_rows()
    spec = PreprocessSpec(**spec_for(fmt))
    if not format_named(fmt).stores_fields:
        with pytest.raises(ImgpackError, match="does not store per-sample fields"):
            pack_rows(rows, SAMPLE_DATA, ["even", "odd"], url, fmt, FIELD_SCHEMA, spec=spec,
                      storage_options=options)  # fmt: skip
        return
    pack_rows(rows, SAMPLE_DATA, ["even", "odd"], url, fmt, FIELD_SCHEMA, spec=spec, workers=1,
              storage_options=options)  # fmt: skip
    it = open_iterable(url, storage_options=options, cache_dir=tmp_path / "cache", shuffle=False,
                       fields=["caption", "boxes"])  # fmt: skip
    got = [(target["caption"], target["boxes"].shape[0]) for _, target in it]
    # The same rows packed locally (the default shuffled order, the same spec) are the reference.
    local = tmp_path / "local"
    pack_rows(rows, SAMPLE_DATA, ["even", "odd"], local, fmt, FIELD_SCHEMA, spec=spec, workers=1)
    it = open_iterable(local, shuffle=False, fields=["caption", "boxes"])
    assert got == [(target["caption"], target["boxes"].shape[0]) for _, target in it]
    assert sorted(caption for caption, _ in got) == sorted(row.fields["caption"] for row in rows)
