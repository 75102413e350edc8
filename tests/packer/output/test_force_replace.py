"""`pack --force` replacing a dataset: an open reader never mixes old and new samples, targets come
from the data the reader opened, and a BMP cache of every flat source is replaced."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from readers import open_dataset
from readers.errors import DatasetReplacedError
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.cli import assert_one_line, pack_sample

# -- a reader open while `pack --force` replaces its dataset never mixes old and new ------


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
    from packer.output.output_dir import exchange
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


# -- targets come from the data the reader opened -----------------------------------------
@pytest.mark.parametrize("fmt", format_names())
def test_targets_after_force_are_the_open_datasets_or_refused(tmp_path, fmt):
    out = tmp_path / "ds"
    pack_sample(out, fmt, "--seed", "0")
    shutil.copytree(out, tmp_path / "old")
    old = open_dataset(tmp_path / "old").targets
    reader = open_dataset(out, decode="numpy")
    assert reader[0][1] == old[0]  # the first part is open
    pack_sample(out, fmt, "--seed", "1", "--force")
    new = open_dataset(out).targets
    assert new != old  # the re-pack holds the samples in another order
    try:
        targets = reader.targets
    except DatasetReplacedError as exc:
        assert f"{out}: the dataset was replaced" in str(exc)
    else:
        assert targets == old


# -- pack --force replaces a BMP cache whose images sit at its top level ------------------
def _flat_sources(tmp_path: Path) -> dict[str, list]:
    """``pack`` arguments of sources without class folders (imagelist, COCO, Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support.cocodata import make_coco

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
