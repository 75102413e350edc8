"""Issue 31 (trust, round 4): the cases a second probe of wave 3 still broke, one test each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from readers import open_dataset
from readers.errors import DatasetReplacedError
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli


def _pack(out: Path, fmt: str, *extra) -> None:
    run_cli("imagefolder", SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--shards", "3",
            "--workers", "1", "-q", *extra, check=True)


# -- case 1: targets come from the data the reader opened -----------------------------------------
@pytest.mark.parametrize("fmt", format_names())
def test_targets_after_force_are_the_open_datasets_or_refused(tmp_path, fmt):
    out = tmp_path / "ds"
    _pack(out, fmt, "--seed", "0")
    shutil.copytree(out, tmp_path / "old")
    old = open_dataset(tmp_path / "old").targets
    reader = open_dataset(out, decode="numpy")
    assert reader[0][1] == old[0]  # the first part is open
    _pack(out, fmt, "--seed", "1", "--force")
    new = open_dataset(out).targets
    assert new != old  # the re-pack holds the samples in another order
    try:
        targets = reader.targets
    except DatasetReplacedError as exc:
        assert f"{out}: the dataset was replaced" in str(exc)
    else:
        assert targets == old


# -- case 2: a resume state names the dataset it was saved on -------------------------------------
def test_a_state_from_another_seeds_pack_is_refused_naming_both(tmp_path):
    from readers import open_iterable
    from readers.resume import ResumeError

    for seed in (0, 1):
        _pack(tmp_path / f"seed{seed}", "lmdb", "--seed", str(seed))
    options = {"batch_size": 4, "crop": 24}
    saved = open_iterable(tmp_path / "seed0", **options)
    batches = iter(saved)
    next(batches)
    state = saved.state_dict()
    same = open_iterable(tmp_path / "seed0", **options)
    same.load_state_dict(state)  # the dataset it was saved on resumes
    state_without_id = {k: v for k, v in state.items() if k != "dataset"}
    same.load_state_dict(state_without_id)  # a state saved before states named their dataset
    other = open_iterable(tmp_path / "seed1", **options)
    with pytest.raises(ResumeError) as caught:
        other.load_state_dict(state)
    message = str(caught.value)
    assert "shuffled:0:" in message and "shuffled:1:" in message and str(tmp_path / "seed1") in message


# -- case 4: a NUL byte in a source path is a recorded skip ---------------------------------------
def test_a_nul_byte_in_an_imagelist_path_is_a_recorded_skip(tmp_path):
    from packer.imagelist import scan_list

    first = sorted((SAMPLE_DATA / "animals").iterdir())[0].name
    listing = tmp_path / "l.jsonl"
    rows = [{"path": f"animals/{first}", "label": "animals"}, {"path": "animals/a\0b.jpg", "label": "x"}]
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scan = scan_list(listing, SAMPLE_DATA)
    assert [i.rel for i in scan.items] == [f"animals/{first}"]
    assert [s["reason"] for s in scan.skipped] == [
        "l.jsonl line 2: the path holds a NUL byte, which no file name can; fix the list"
    ]


def test_a_nul_byte_in_a_coco_file_name_is_a_recorded_skip(tmp_path):
    from packer.coco import coco_source
    from tests.cocodata import make_coco

    annotations = make_coco(tmp_path, count=3, empty=0)
    data = json.loads(annotations.read_text())
    data["images"][1]["file_name"] = "a\0b.jpg"
    annotations.write_text(json.dumps(data))
    scan = coco_source(annotations, tmp_path / "images")
    assert len(scan.items) == 2
    assert any("NUL byte" in s["reason"] and "images[1]" in s["reason"] for s in scan.skipped)


# -- case 5: a JPEG whose sampling simplejpeg's header parser cannot name ------------------------
def _jpeg_441() -> bytes:
    """A flat grey 16x32 baseline JPEG sampled 4:4:1 (luma 1x4), which no common encoder writes:
    OpenCV's 4:4:0 file with the luma factor set to 1x4 and scan data for all-zero blocks (with the
    standard Huffman tables: luma DC 0 = 00, luma EOB = 1010, chroma DC 0 = 00, chroma EOB = 00)."""
    import cv2

    grey = np.full((32, 16, 3), 128, np.uint8)
    ok, buf = cv2.imencode(".jpg", grey, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, 0x121111])  # 4:4:0
    data = buf.tobytes()
    sof, sos = data.find(b"\xff\xc0"), data.find(b"\xff\xda")
    head = bytearray(data[:sos])
    head[sof + 11] = 0x14  # component 1 (Y): h=1, v=4
    scan_header = data[sos : sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")]
    mcu = bytes([0x28, 0xA2, 0x8A, 0x00])  # 4 luma blocks then Cb and Cr, all zero
    return bytes(head) + scan_header + mcu * 2 + b"\xff\xd9"


def test_a_441_jpeg_packed_original_reads_on_every_format(tmp_path):
    from PIL import Image

    from readers import open_iterable

    source = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA / "animals", source / "animals")
    (source / "animals" / "zz441.jpg").write_bytes(_jpeg_441())
    with Image.open(source / "animals" / "zz441.jpg") as img:
        assert img.layer[0][1:3] == (1, 4)  # the sampling the probe found
    for fmt in format_names():
        out = tmp_path / fmt
        run_cli("imagefolder", source, "--to", fmt, "-o", out, "--encode", "original", "--order", "source",
                "--workers", "1", "-q", check=True)  # fmt: skip
        ds = open_dataset(out, decode="numpy")
        image = ds[len(ds) - 1][0]
        assert image.shape == (32, 16, 3) and (np.abs(image.astype(int) - 128) <= 1).all(), fmt
        batches = open_iterable(out, shuffle=False, batch_size=len(ds), crop=16, resize=16)
        assert next(iter(batches))[0].shape[0] == len(ds), fmt


# -- case 6: a missing --workdir, a directory in the label file's place, an epoch beyond range ----
def assert_one_line(proc, *needles: str, rc: int = 1) -> str:
    """A CLI run that failed with one line naming ``needles`` (no traceback)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == rc and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


def test_a_missing_workdir_is_one_line_for_webdataset_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _pack(tmp_path / "shards", "tar")
    table = tmp_path / "t.parquet"
    image = (SAMPLE_DATA / "animals").iterdir().__next__().read_bytes()
    pq.write_table(pa.table({"image": [{"bytes": image, "path": None}], "label": ["a"]}), table)
    missing = tmp_path / "no" / "such"
    for source in (["webdataset", tmp_path / "shards" / "shard-000000.tar"], ["parquet", table]):
        proc = run_cli(*source, "--workdir", missing, "--to", "lmdb", "-o", tmp_path / "o", "-q")
        assert_one_line(proc, f"{missing}: --workdir is not an existing folder")
        assert not (tmp_path / "o").exists()


def test_reindex_with_a_directory_for_the_label_file_is_one_line(tmp_path):
    from readers.formats.registry import registered

    for fmt in [name for name, f in registered().items() if f.indexer]:  # the formats reindex serves
        _pack(tmp_path / fmt, fmt)
        labels = tmp_path / fmt / "labels.i64"
        labels.unlink()
        labels.mkdir()
        assert_one_line(run_cli("reindex", labels.parent), f"{labels}: is a directory")
        assert labels.is_dir()  # left for the user to move


@pytest.mark.parametrize("epoch", [2**64, -1, 2**32, 1.5])
def test_set_epoch_out_of_range_is_a_clear_error(packed, epoch):
    from readers import make_loader, open_iterable
    from readers.dataset import DeterministicSampler
    from readers.errors import OptionError

    stream = open_iterable(packed("lmdb"), batch_size=4, crop=24)
    loader = make_loader(open_iterable(packed("lmdb"), batch_size=4, crop=24), num_workers=0)
    for target in (stream, loader, DeterministicSampler(10)):
        with pytest.raises(OptionError, match=r"set_epoch\(.*\): the epoch must be"):
            target.set_epoch(epoch)
    stream.set_epoch(2**32 - 1)  # the last epoch the order tells apart


# -- case 7: pack info exits 1 naming a damaged part, for every format ----------------------------
def _missing(part: Path) -> None:
    part.unlink()


def _truncated(part: Path) -> None:
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])


def _directory(part: Path) -> None:
    part.unlink()
    part.mkdir()


def _dev_zero(part: Path) -> None:
    part.unlink()
    part.symlink_to("/dev/zero")


@pytest.mark.parametrize("fmt", format_names())
def test_pack_info_names_a_damaged_part(packed, tmp_path, fmt):
    from readers.formats import open_reader

    for damage in (_missing, _truncated, _directory, _dev_zero):
        root = tmp_path / damage.__name__
        shutil.copytree(packed(fmt), root)
        reader = open_reader(root)
        part = Path(reader.checksum_path(reader.manifest.shards[-1]))
        reader.close()
        damage(part)
        assert_one_line(run_cli("info", root), str(part))


# -- case 8: pack --force replaces a BMP cache whose images sit at its top level ------------------
def _flat_sources(tmp_path: Path) -> dict[str, list]:
    """``pack`` arguments of sources without class folders (imagelist, COCO, Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.cocodata import make_coco

    images = sorted((SAMPLE_DATA / "animals").iterdir())[:3]
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\n" + "".join(f"{p.name},a\n" for p in images))
    coco = make_coco(tmp_path / "coco", count=3, empty=0)
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": [{"bytes": p.read_bytes(), "path": None} for p in images],
                             "label": ["a", "b", "a"]}), table)  # fmt: skip
    return {
        "imagelist": ["imagelist", listing, "--root", SAMPLE_DATA / "animals"],
        "coco": ["coco", coco, "--root", coco.parent / "images"],
        "parquet": ["parquet", table],
    }


def test_force_replaces_a_bmp_cache_of_every_flat_source(tmp_path):
    for kind, source in _flat_sources(tmp_path).items():
        out = tmp_path / f"out-{kind}"
        args = [*source, "--to", "bmp", "-o", out, "--resize", "24", "--workers", "1", "-q"]
        run_cli(*args, check=True)
        assert [p.name for p in out.iterdir() if p.suffix == ".bmp"], kind  # images at the top level
        run_cli(*args, "--force", check=True)
        (out / "notes.txt").write_text("mine")  # a file imgpack did not write is still refused
        assert_one_line(run_cli(*args, "--force"), f"{out}: is not an imgpack output", "notes.txt")


# -- case 9: a state saved after a finished pass resumes the next epoch, whatever num_workers ----
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_after_a_finished_pass_resumes_the_next_whole_epoch(packed, workers):
    from readers import make_loader, open_iterable

    def loader():
        return make_loader(open_iterable(packed("lmdb"), batch_size=8, crop=24, seed=0), num_workers=workers)

    run = loader()
    first = [labels.tolist() for _, labels in run]
    state = run.state_dict()
    assert (state["imgpack"]["epoch"], state["imgpack"]["position"]) == (1, 0)
    uninterrupted = [labels.tolist() for _, labels in run]
    resumed = loader()
    resumed.load_state_dict(state)
    again = [labels.tolist() for _, labels in resumed]
    assert resumed.epoch == 1 and again == uninterrupted and again != first


# -- case 11: --resume with nothing to resume says so; --resume --force is refused ---------------
def test_resume_with_nothing_to_resume_says_so_and_resume_force_is_refused(tmp_path):
    out = tmp_path / "ds"
    args = ["imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "24", "--workers", "1", "-q"]
    proc = run_cli(*args, "--resume", check=True)
    assert f"{out}: nothing to resume (no interrupted pack there); packing from the start" in proc.stderr
    assert open_dataset(out).targets  # and it packed
    assert_one_line(run_cli(*args, "--resume", "--force"), f"{out}: --force (start over) and --resume")
    assert_one_line(run_cli(*args, "--resume"), f"{out}: already complete")


# -- case 12: warnings print no line of imgpack's source; a null Parquet image cell is a skip ----
def test_the_cached_index_refetch_warning_is_one_line(s3, packed, tmp_path):
    import subprocess
    import sys

    from tests.conftest import cli_env

    fs, options = s3
    fs.put(str(packed("tar")), "imgpack-test/warn-idx", recursive=True)
    url, cache = "s3://imgpack-test/warn-idx", tmp_path / "cache"
    script = (
        "import json, sys\nfrom readers import open_dataset\n"
        "ds = open_dataset(sys.argv[1], storage_options=json.loads(sys.argv[2]), cache_dir=sys.argv[3])\n"
        "print(ds[0][1])\n"
    )
    run = [sys.executable, "-c", script, url, json.dumps(options), str(cache)]
    subprocess.run(run, check=True, env=cli_env(), capture_output=True, timeout=120)
    idx = next(cache.glob("*.idx"))
    idx.write_text("v1.2 x\nnot an index\n")
    proc = subprocess.run(run, check=True, env=cli_env(), capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{idx}: cached index is damaged" in lines[0], proc.stderr
    assert "warn(" not in proc.stderr and ".py:" not in proc.stderr


def test_a_null_parquet_image_cell_is_a_recorded_skip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = sorted((SAMPLE_DATA / "animals").iterdir())[:2]
    cells = [{"bytes": p.read_bytes(), "path": None} for p in images]
    cells.insert(1, None)
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": cells, "label": ["a", "b", "a"]}), table)
    out = tmp_path / "ds"
    run_cli("parquet", table, "--to", "lmdb", "-o", out, "--resize", "24", "--workers", "1", "-q", check=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 2
    reasons = [s["reason"] for s in manifest["skipped"]]
    assert reasons == ["t.parquet row 1: column 'image' is null (no image)"]
