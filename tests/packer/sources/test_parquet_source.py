"""pack parquet: a Parquet table of image bytes (as Hugging Face writes images) and an Arrow table
of paths, with labels and extra columns kept as fields."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from readers import open_dataset
from tests.conftest import SAMPLE_DATA, run_cli

SOURCE_ORDER = ("--order", "source")  # these tests index samples in the source's order


def png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((20, 30, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_bytes_with_names_as_labels_and_fields(tmp_path):
    table = pa.table(
        {
            "image": [{"bytes": png(10 * i), "path": None} for i in range(9)]
            + [{"bytes": b"junk", "path": None}],
            "label": ["cat", "dog", "émeu"] * 3 + ["cat"],
            "caption": [f"photo n°{i}" for i in range(10)],
            "score": [i / 4 for i in range(10)],
        }
    )
    path = tmp_path / "train-00000.parquet"
    pq.write_table(table, path, row_group_size=4)
    out = tmp_path / "out.lmdb"
    args = [
        "parquet",
        str(path),
        "--to",
        "lmdb",
        "-o",
        str(out),
        "--encode",
        "png",
        "--workers",
        "1",
        "-q",
        *SOURCE_ORDER,
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == ["cat", "dog", "émeu"] and manifest["num_samples"] == 9
    assert len(manifest["skipped"]) == 1  # the row whose bytes are not an image
    ds = open_dataset(out, decode="numpy", fields=["caption", "score"])
    for i in range(9):
        image, target = ds[i]
        assert int(image[0, 0, 0]) == 10 * i and target["caption"] == f"photo n°{i}"
        assert target["label"] == i % 3 and target["score"] == i / 4


def test_arrow_table_of_paths(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(4):
        (tmp_path / "src" / f"{i}.png").write_bytes(png(50 * i))
    feather.write_feather(
        pa.table({"file": [f"{i}.png" for i in range(4)], "cls": [0, 1, 1, 0]}), tmp_path / "src" / "t.arrow"
    )
    out = tmp_path / "out-tar"
    args = [
        "parquet",
        str(tmp_path / "src" / "t.arrow"),
        "--label-column",
        "cls",
        "--to",
        "tar",
        "-o",
        str(out),
        "-q",
        "--order",
        "source",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ds = open_dataset(out)
    assert [ds[i][1] for i in range(4)] == [0, 1, 1, 0]


def test_not_a_table_is_one_clear_line(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"nope")
    result = CliRunner().invoke(main, ["parquet", str(bad), "--to", "lmdb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "not a readable Parquet/Arrow table" in result.output


def test_a_float_label_column_is_integer_classes(tmp_path):
    """Issue 32: labels 0.0 ... 11.0 (what pandas writes for an int column with a null) were sorted
    as text, so the row labelled 10.0 got class 2."""
    labels = [float(i) for i in range(12)] + [None]
    table = pa.table({"image": [{"bytes": png(10 * i), "path": None} for i in range(13)], "label": labels})
    assert table.schema.field("label").type == pa.float64()
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    out = tmp_path / "out.lmdb"
    args = ["parquet", str(path), "--to", "lmdb", "-o", str(out), "--encode", "png", "-q", *SOURCE_ORDER]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == [str(i) for i in range(12)]
    ds = open_dataset(out, decode="numpy")
    assert [ds[i][1] for i in range(12)] == list(range(12))


def test_a_fractional_label_is_refused_naming_the_row(tmp_path):
    table = pa.table({"image": [{"bytes": png(1), "path": None}] * 3, "label": [1.0, 2.5, 0.0]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    result = CliRunner().invoke(main, ["parquet", str(path), "--to", "lmdb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "t.parquet row 1: column 'label' holds 2.5, which names no class" in result.output


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
