"""Issue 25 (trust, round 3), pack side: label lists, 16-bit PNGs, symlinks, full disks, replaced datasets."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from packer.imagelist import scan_list
from readers import read_manifest
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli
from tests.helpers_disks import mounted_tmpfs
from tests.packrun import copy_source


def _images(folder, names, size=(8, 8)):
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(np.full((*size, 3), 40 * i % 250, np.uint8)).save(folder / name)
    return folder


# -- item 3: JSON labels that are neither an integer nor a name ---------------------------------


def test_jsonl_labels_that_are_not_integers_or_names_are_skipped(tmp_path):
    root = _images(tmp_path / "imgs", [f"{i}.png" for i in range(6)])
    labels = ["cat", None, True, [1], {"a": 1}, 2.5]
    listing = tmp_path / "l.jsonl"
    listing.write_text(
        "".join(json.dumps({"path": f"{i}.png", "label": v}) + "\n" for i, v in enumerate(labels))
    )
    scan = scan_list(listing, root)
    assert scan.classes == ["cat"]
    assert [i.rel for i in scan.items] == ["0.png"]
    assert [s["reason"] for s in scan.skipped] == [
        f"l.jsonl line {n}: label {shown} is neither an integer nor a class name"
        for n, shown in [(2, "null"), (3, "true"), (4, "[1]"), (5, '{"a": 1}'), (6, "2.5")]
    ]


def test_jsonl_paths_that_are_not_strings_are_skipped(tmp_path):
    root = _images(tmp_path / "imgs", ["0.png"])
    shutil.copy(root / "0.png", root / "None")  # a file named like str(None)
    listing = tmp_path / "l.jsonl"
    listing.write_text(
        json.dumps({"path": "0.png", "label": 0}) + "\n" + json.dumps({"path": None, "label": 0}) + "\n"
    )
    scan = scan_list(listing, root)
    assert [i.rel for i in scan.items] == ["0.png"]
    assert scan.skipped == [
        {"path": "<l.jsonl line 2>", "reason": "l.jsonl line 2: path null is not a string"}
    ]


# -- item 4: a quoted CSV field with a newline --------------------------------------------------


def test_csv_quoted_newline_stays_in_its_field(tmp_path):
    root = _images(tmp_path / "imgs", ["a.png", "b.png", "a\nb.png"])
    os.remove(root / "a\nb.png")  # the file the row names is missing: it must not become another file
    listing = tmp_path / "l.csv"
    listing.write_text('path,label\n"a\nb.png",x\nb.png,y\n', encoding="utf-8")
    scan = scan_list(listing, root)
    assert [i.rel for i in scan.items] == ["b.png"]
    assert scan.skipped == [{"path": "a\nb.png", "reason": f"l.csv line 2: file not found under {root}"}]
    # the line number of a row after a multi-line field is the line it starts on
    listing.write_text('path,label\n"a\nb.png",x\nnope.png,y\nb.png,y\n', encoding="utf-8")
    assert scan_list(listing, root).skipped[1]["reason"].startswith("l.csv line 4: file not found")


# -- item 7: symlinks under --root that leave it ------------------------------------------------


def test_symlinks_under_root_that_point_outside_are_skipped(tmp_path):
    root = _images(tmp_path / "root", ["in.png"])
    outside = _images(tmp_path / "secret", ["s.png"])
    os.symlink(outside / "s.png", root / "file_link.png")
    os.symlink(outside, root / "dir_link")
    os.symlink(root / "in.png", root / "inner_link.png")  # a link that stays inside is fine
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\nin.png,a\nfile_link.png,a\ndir_link/s.png,a\ninner_link.png,a\n")
    scan = scan_list(listing, root)
    assert [i.rel for i in scan.items] == ["in.png", "inner_link.png"]
    assert [s["reason"] for s in scan.skipped] == [
        f"l.csv line 3: outside --root {root} (a symlink to {outside / 's.png'})",
        f"l.csv line 4: outside --root {root} (a symlink to {outside / 's.png'})",
    ]
    out = tmp_path / "out"
    proc = run_cli("imagelist", listing, "--root", root, "--to", "tar", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 2


# -- item 10: fields and labels that are too big ------------------------------------------------


def _pack_list(tmp_path, listing, root):
    return run_cli("imagelist", listing, "--root", root, "--to", "lmdb", "-o", tmp_path / "out", "-q")


def test_a_csv_field_over_the_csv_limit_is_one_line_naming_the_line(tmp_path):
    root = _images(tmp_path / "imgs", ["a.png"])
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\na.png,0\n" + "x" * 200_000 + ",0\n")
    proc = _pack_list(tmp_path, listing, root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{listing}: line 3: a field is longer than" in proc.stderr


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_huge_integer_labels_are_skips_not_crashes(tmp_path, kind):
    root = _images(tmp_path / "imgs", ["a.png", "b.png", "c.png"])
    big, huge = "1000000000", "9" * 5000
    listing = tmp_path / f"l.{kind}"
    rows = [("a.png", "1"), ("b.png", big), ("c.png", huge)]
    if kind == "csv":
        listing.write_text("path,label\n" + "".join(f"{p},{v}\n" for p, v in rows))
    else:
        listing.write_text("".join(f'{{"path": "{p}", "label": {v}}}\n' for p, v in rows))
    proc = _pack_list(tmp_path, listing, root)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    manifest = read_manifest(tmp_path / "out")
    assert manifest.num_samples == 1 and manifest.classes == ["0", "1"]
    reasons = [s["reason"] for s in manifest.skipped]
    line = 3 if kind == "csv" else 2  # after the header row / the first JSON object
    assert reasons[0].startswith(f"l.{kind} line {line}: label 1000000000 is far above the number of rows")
    assert reasons[1].startswith(f"l.{kind} line {line + 1}: label 9999") and "(5000 digits)" in reasons[1]
    assert "--classes" in reasons[0] and len(reasons[1]) < 300


# -- item 2: 16-bit images are scaled by their bit depth, not by their maximum ------------------


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_16_bit_values_keep_their_high_byte_whatever_the_maximum(mode):
    from packer.preprocess import PreprocessSpec, preprocess_image

    for value, expected in [(200, 0), (255, 0), (256, 1), (200 * 257, 200), (65535, 255)]:
        array = np.full((4, 4), value, np.uint16 if mode.startswith("I;16") else np.int32)
        img = Image.frombytes(mode, (4, 4), array.astype(">u2" if mode == "I;16B" else array.dtype).tobytes())
        out, _ = preprocess_image(img, b"", PreprocessSpec(encode="png"))
        assert np.asarray(out).max() == np.asarray(out).min() == expected, (mode, value)


def test_a_near_black_16_bit_png_packs_near_black(tmp_path):
    from readers import open_dataset

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(np.full((8, 8), 200, np.uint16)).save(src / "dark.png")  # 200/65535: near black
    Image.fromarray(np.full((8, 8), 51400, np.uint16)).save(src / "grey.png")  # 200/255 after scaling
    run_cli(
        "imagefolder",
        tmp_path / "src",
        "--to",
        "lmdb",
        "-o",
        tmp_path / "out",
        "--encode",
        "png",
        "-q",
        check=True,
    )
    ds = open_dataset(tmp_path / "out")
    assert sorted(int(np.asarray(ds[i][0]).max()) for i in range(len(ds))) == [0, 200]


# -- item 13: --upscale bounded by --max-pixels on the result -----------------------------------


def test_upscaling_a_thin_strip_past_max_pixels_is_a_skip_with_a_reason(tmp_path):
    src = _images(tmp_path / "src" / "c", ["ok.png"], size=(40, 40))
    Image.fromarray(np.zeros((1, 2000, 3), np.uint8)).save(src / "strip.png")  # 1 x 2000
    out = tmp_path / "out"
    # covering --crop 64 makes it 64 x 128000 = 8.2 million pixels, over --max-pixels 1,000,000
    run_cli("imagefolder", tmp_path / "src", "--to", "tar", "-o", out, "--crop", "64", "--upscale",
            "--max-pixels", "1000000", "-q", check=True)  # fmt: skip
    manifest = read_manifest(out)
    assert manifest.num_samples == 1
    assert manifest.skipped == [
        {
            "path": "c/strip.png",
            "reason": "enlarging 2000x1 to 128000x64 (8,192,000 pixels) exceeds the --max-pixels limit of "
            "1,000,000; such a thin image is rarely a real sample (drop --upscale, or raise --max-pixels)",
        }
    ]


def test_a_decoder_error_without_a_message_is_named_by_its_type(monkeypatch, tmp_path):
    from packer import preprocess

    src = _images(tmp_path / "c", ["a.png"])

    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(preprocess, "_encode", out_of_memory)
    with pytest.raises(preprocess.SkipSample, match="^cannot decode image: MemoryError$"):
        preprocess.preprocess_file(str(src / "a.png"), "a.png", 0, 0, preprocess.PreprocessSpec(encode="png"))


# -- item 9: a full disk is one line for every format, small buffered writes included -------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB tmpfs, mounted for the test (root only, as in CI) and unmounted after it."""
    with mounted_tmpfs(tmp_path / "tiny-disk", "256k") as mount:
        yield mount


@pytest.mark.root
@pytest.mark.parametrize("fmt", format_names())
def test_a_full_disk_under_small_samples_is_one_line(tmp_path, tiny_disk, fmt):
    # small JPEGs sit in the file's write buffer when the disk fills: closing it must not raise again
    src = copy_source(tmp_path / "src", copies=4)
    proc = run_cli(
        "imagefolder", src, "--to", fmt, "-o", tiny_disk / "ds", "--resize", "64", "--workers", "1", "-q"
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        len(lines) == 1 and lines[0].startswith("Error: ") and "no space left on device" in lines[0].lower()
    ), lines


# -- item 8: a file name that is not UTF-8 packs into every format, --resume included ------------

ODD_NAME = b"caf\xe9.png"  # Latin-1 bytes: not UTF-8


def _odd_source(tmp_path, plain=1):
    src = _images(tmp_path / "src" / "c", [f"plain{i}.png" for i in range(plain)], size=(300, 300))
    shutil.copy(src / "plain0.png", os.path.join(os.fsencode(src), ODD_NAME))
    return tmp_path / "src"


@pytest.mark.parametrize("fmt", format_names())
def test_a_file_name_that_is_not_utf8_packs(tmp_path, fmt):
    from packer.verify import verify_dataset

    out = tmp_path / "out"
    proc = run_cli("imagefolder", _odd_source(tmp_path), "--to", fmt, "-o", out, "--resize", "16", "-q")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 2 and verify_dataset(out).ok


def test_tfrecord_keeps_the_file_name_bytes_and_resume_packs_it(tmp_path):
    import struct

    from readers.formats.tfrecord.example import decode_example
    from tests.packrun import SLOW_PACK, kill_group, run_pack, start_pack, wait_started

    out = tmp_path / "out"
    # 40 images at 256 px as PNG: a pack still running when it is killed
    args = [
        _odd_source(tmp_path, plain=40),
        "--to",
        "tfrecord",
        "-o",
        out,
        "--workers",
        "1",
        "-q",
        *SLOW_PACK,
    ]
    proc = start_pack(*args)
    wait_started(out, proc)
    kill_group(proc.pid)
    proc.communicate()
    rc, text = run_pack(*args, "--resume")
    assert rc == 0, text
    [shard] = read_manifest(out).shards
    data = (out / shard.file).read_bytes()
    names = []
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        names += decode_example(data[12 : 12 + length])["image/filename"]
        data = data[12 + length + 4 :]
    assert b"c/" + ODD_NAME in [bytes(n) for n in names] and len(names) == 41


# -- item 6: every field of a resume state, at every level, is checked ----------------------------

RESUME_SPEC = {"resize": 40, "crop": 32, "encode": "png"}
DROP = object()  # a field taken out of the state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"epoch": 10**30}, "'epoch'"),
        ({"epoch": 2**63}, "'epoch'"),
        ({"epoch": 1.0}, "'epoch'"),
        ({"position": 2.5}, "'position'"),
        ({"shuffle": 1}, "'shuffle'"),
        ({"seed": True}, "'seed'"),
        ({"world_size": 0}, "'world_size'"),
        ({"rank": 3}, "'rank'"),
        ({"unit": 0}, "'unit'"),
        ({"worker": 0}, "one DataLoader worker.s state"),  # not for the main process
    ],
)
def test_each_top_level_field_is_checked(packed, change, message):
    from readers import ResumeError, open_iterable

    it = open_iterable(packed("lmdb", **RESUME_SPEC), seed=1, batch_size=4)
    with pytest.raises(ResumeError, match=message):
        it.load_state_dict({**it.state_dict(consumed=8), **change})


def _loader_state(path, workers=2, steps=3):
    from readers import make_loader, open_iterable

    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=workers)
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    state = loader.state_dict()
    del batches
    return state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"worker_samples": 10**12}, r"'worker_samples'=1000000000000 is outside 0\.\.\d+"),
        ({"worker_samples": 2.5}, "'worker_samples' must be an integer"),
        ({"worker_samples": -1}, "'worker_samples'"),
        ({"epoch": 2}, "'epoch'=2 .* the loader's epoch 0"),  # 1 is an epoch boundary's snapshot
        ({"epoch": 2**63}, "'epoch'"),
        ({"worker": 1}, "'worker'=1 .* worker_0"),
        ({"num_workers": 3}, "'num_workers'=3"),
        ({"worker_samples": DROP}, "has worker, num_workers but not worker_samples"),
    ],
)
def test_each_worker_state_field_is_checked_when_the_loader_state_is_loaded(packed, change, message):
    from readers import ResumeError, make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    state = _loader_state(path)
    worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert "worker_samples" in worker  # the worker has read: its own progress is in the state
    for key, value in change.items():
        if value is DROP:
            del worker[key]
        else:
            worker[key] = value
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    with pytest.raises(ResumeError, match=message):
        loader.load_state_dict(state)


def test_the_loader_level_num_workers_is_checked(packed):
    from readers import ResumeError, make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    state = _loader_state(path)
    state["imgpack"]["num_workers"] = 2.0
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    with pytest.raises(ResumeError, match="'num_workers' must be an integer"):
        loader.load_state_dict(state)


def test_an_untouched_loader_state_still_resumes_exactly(packed):
    from readers import make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    full = [b[1].tolist() for b in make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)]
    state = _loader_state(path)
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    loader.load_state_dict(state)
    assert [b[1].tolist() for b in loader] == full[3:]


# -- item 5: a TFRecord record whose stored size disagrees with its image -------------------------


def _swap_stored_sizes(path):
    """Rewrite every record of a TFRecord dataset with height and width swapped in its features
    (the same byte length, CRCs recomputed): what a foreign or hand-edited record may hold."""
    from readers.formats.tfrecord.example import decode_example, encode_example
    from readers.formats.tfrecord.reader import META_FEATURE, frame

    for shard in read_manifest(path).shards:
        data, out = (path / shard.file).read_bytes(), b""
        while data:
            length = int.from_bytes(data[:8], "little")
            features = {k: [bytes(x) if isinstance(x, memoryview) else x for x in v]
                        for k, v in decode_example(data[12 : 12 + length]).items()}  # fmt: skip
            meta = features[META_FEATURE.decode()]
            meta[1], meta[2] = meta[2], meta[1]
            features["image/height"], features["image/width"] = (
                features["image/width"],
                features["image/height"],
            )
            payload = encode_example(features)
            assert len(payload) == length
            out += frame(payload)
            data = data[12 + length + 4 :]
        (path / shard.file).write_bytes(out)


def test_tfrecord_image_size_comes_from_the_image_on_every_path(tmp_path, packed):
    from readers import open_dataset, open_iterable

    original = packed("tfrecord", resize=40, encode="jpeg")
    tampered = tmp_path / "tampered"
    shutil.copytree(original, tampered)
    _swap_stored_sizes(tampered)
    n = len(open_dataset(original))

    def batch(path):
        return next(iter(open_iterable(path, shuffle=False, batch_size=n, crop=32)))[0].numpy()

    assert np.array_equal(batch(tampered), batch(original))  # the batch path
    ours, theirs = open_dataset(tampered, decode="numpy"), open_dataset(original, decode="numpy")
    assert all(np.array_equal(ours[i][0], theirs[i][0]) for i in range(n))  # the map path


# -- item 1: a reader open while `pack --force` replaces its dataset never mixes old and new ------


@pytest.mark.parametrize("fmt", format_names())
def test_an_open_reader_never_mixes_old_and_new_samples_after_force(tmp_path, fmt):
    from readers import open_dataset
    from readers.errors import DatasetReplacedError

    out = tmp_path / "ds"
    common = ["--to", fmt, "-o", out, "--shards", "3", "--encode", "png", "--workers", "1", "-q"]
    run_cli("imagefolder", SAMPLE_DATA, *common, "--resize", "24", check=True)
    shutil.copytree(out, tmp_path / "old")
    old = open_dataset(tmp_path / "old", decode="numpy")
    reader = open_dataset(out, decode="numpy")
    assert np.array_equal(reader[0][0], old[0][0])  # the first part is open
    run_cli("imagefolder", SAMPLE_DATA, *common, "--resize", "40", "--force", check=True)
    read = 0
    with pytest.raises(DatasetReplacedError) as caught:
        for i in range(len(old)):
            image, label = reader[i]
            assert np.array_equal(image, old[i][0]) and label == old[i][1], f"sample {i} is not the old one"
            read += 1
    message = str(caught.value)
    assert read < len(old)  # the later parts are the new dataset's: they must not be read
    assert f"{out}: the dataset was replaced" in message and "open the dataset again" in message
    assert open_dataset(out, decode="numpy")[0][0].shape[:2] != old[0][0].shape[:2]  # reopened: the new one


@pytest.mark.parametrize("fmt", format_names())
def test_an_open_batch_iterable_stops_with_replaced_when_force_swaps_its_dataset(tmp_path, fmt):
    from readers import open_iterable
    from readers.errors import DatasetReplacedError

    out = tmp_path / "ds"
    common = ["--to", fmt, "-o", out, "--shards", "3", "--crop", "24", "--upscale", "--workers", "1", "-q"]
    run_cli("imagefolder", SAMPLE_DATA, *common, "--resize", "24", check=True)
    batches = iter(open_iterable(out, shuffle=False, batch_size=4, block_size=4))
    first = next(batches)
    run_cli("imagefolder", SAMPLE_DATA, *common, "--resize", "40", "--force", check=True)
    with pytest.raises(DatasetReplacedError, match="open the dataset again"):
        for _ in batches:
            pass
    assert first[0].shape == (4, 3, 24, 24)


def test_a_swap_between_reading_the_manifest_and_opening_the_reader_is_caught(tmp_path, monkeypatch):
    import readers.formats as formats
    from packer.output import exchange
    from readers.errors import DatasetReplacedError

    for name in ("ds", "new"):
        run_cli(
            "imagefolder",
            SAMPLE_DATA,
            "--to",
            "hdf5",
            "-o",
            tmp_path / name,
            "--resize",
            "24",
            "-q",
            check=True,
        )
    real_read = formats.read_manifest

    def read_then_swap(path, storage_options=None):
        manifest = real_read(path, storage_options)
        exchange(tmp_path / "new", tmp_path / "ds")  # what `pack --force` does, right after the read
        return manifest

    monkeypatch.setattr(formats, "read_manifest", read_then_swap)
    with pytest.raises(DatasetReplacedError, match="open the dataset again"):
        formats.open_reader(tmp_path / "ds")
