"""Label lists (CSV, JSONL) with bad rows: labels that are neither integers nor names, paths that are
not strings, quoted newlines, over-long fields and huge integers are skips or one line, not crashes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from packer.sources.imagelist import scan_list
from readers import read_manifest
from tests.conftest import run_cli
from tests.support.cli import write_images

# -- JSON labels that are neither an integer nor a name ---------------------------------


def test_jsonl_labels_that_are_not_integers_or_names_are_skipped(tmp_path):
    root = write_images(tmp_path / "imgs", [f"{i}.png" for i in range(6)])
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
    root = write_images(tmp_path / "imgs", ["0.png"])
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


# -- a quoted CSV field with a newline --------------------------------------------------


def test_csv_quoted_newline_stays_in_its_field(tmp_path):
    root = write_images(tmp_path / "imgs", ["a.png", "b.png", "a\nb.png"])
    os.remove(root / "a\nb.png")  # the file the row names is missing: it must not become another file
    listing = tmp_path / "l.csv"
    listing.write_text('path,label\n"a\nb.png",x\nb.png,y\n', encoding="utf-8")
    scan = scan_list(listing, root)
    assert [i.rel for i in scan.items] == ["b.png"]
    assert scan.skipped == [{"path": "a\nb.png", "reason": f"l.csv line 2: file not found under {root}"}]
    # the line number of a row after a multi-line field is the line it starts on
    listing.write_text('path,label\n"a\nb.png",x\nnope.png,y\nb.png,y\n', encoding="utf-8")
    assert scan_list(listing, root).skipped[1]["reason"].startswith("l.csv line 4: file not found")


# -- fields and labels that are too big ------------------------------------------------


def _pack_list(tmp_path, listing, root):
    return run_cli("imagelist", listing, "--root", root, "--to", "lmdb", "-o", tmp_path / "out", "-q")


def test_a_csv_field_over_the_csv_limit_is_one_line_naming_the_line(tmp_path):
    root = write_images(tmp_path / "imgs", ["a.png"])
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\na.png,0\n" + "x" * 200_000 + ",0\n")
    proc = _pack_list(tmp_path, listing, root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{listing}: line 3: a field is longer than" in proc.stderr


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_huge_integer_labels_are_skips_not_crashes(tmp_path, kind):
    root = write_images(tmp_path / "imgs", ["a.png", "b.png", "c.png"])
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
