"""``pack imagelist``: label files (CSV, TSV, JSONL) as a source, with bad rows skipped and named."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.engine.pack_run import pack_folder
from packer.sources.imagelist import scan_list
from packer.sources.source import scan_folder
from readers import open_dataset, read_manifest
from readers.errors import ImgpackError
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA, run_cli

SPEC = {"resize": 32, "crop": 32, "encode": "png"}


def folder_rows():
    """(relative path, class name) of sample_data in ImageFolder order."""
    scan = scan_folder(SAMPLE_DATA)
    return [(item.rel, scan.classes[item.label]) for item in scan.items], scan.classes


def write_csv(path, rows, header=("path", "label"), sep=","):
    lines = [sep.join(header)] if header else []
    lines += [sep.join(f'"{c}"' if sep == "," and ("," in c or " " in c) else c for c in r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_list_of_the_folder_packs_exactly_like_imagefolder(tmp_path, packed):
    rows, _ = folder_rows()
    listing = write_csv(tmp_path / "all.csv", rows)
    out = tmp_path / "list.lmdb"
    run_cli("imagelist", listing, "--root", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--resize", "32",
            "--crop", "32", "--encode", "png", "--workers", "2", check=True)  # fmt: skip
    ours, theirs = open_dataset(out, decode="bytes"), open_dataset(packed("lmdb", **SPEC), decode="bytes")
    assert [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]
    manifest, reference = read_manifest(out), read_manifest(packed("lmdb", **SPEC))
    assert manifest.classes == reference.classes
    assert manifest.skipped == reference.skipped  # the same undecodable files, same reasons
    assert manifest.extra["list"] == str(listing.resolve())


def test_bad_rows_are_skipped_with_their_line(tmp_path):
    rows, classes = folder_rows()
    good = rows[:6]
    listing = [
        *good[:3],
        ("animals/no_such.jpg", classes[0]),  # line 5: missing file
        (good[0][0], classes[0]),  # line 6: duplicate of line 2
        (good[3][0], "zebra"),  # line 7: unknown label
        ("../outside.jpg", classes[0]),  # line 8
        ("", classes[0]),  # line 9
        *good[4:],
    ]
    classes_file = tmp_path / "classes.txt"
    classes_file.write_text("\n".join(classes) + "\n")
    scan = scan_list(write_csv(tmp_path / "l.csv", listing), SAMPLE_DATA, classes_file)
    assert [i.rel for i in scan.items] == [r for r, _ in good[:3]] + [r for r, _ in good[4:]]
    assert [i.index for i in scan.items] == list(range(5))
    assert [scan.classes[i.label] for i in scan.items] == [c for _, c in good[:3] + good[4:]]
    reasons = [s["reason"] for s in scan.skipped]
    assert reasons == [
        f"l.csv line 5: file not found under {SAMPLE_DATA}",
        "l.csv line 6: duplicate of line 2",
        f"l.csv line 7: unknown label 'zebra' ({len(classes)} classes from {classes_file})",
        f"l.csv line 8: outside --root {SAMPLE_DATA}",
        "l.csv line 9: empty path",
    ]


def test_integer_labels_jsonl_and_tsv_without_header(tmp_path):
    rows, classes = folder_rows()
    ints = [(rel, str(classes.index(name))) for rel, name in rows[:10]]
    jsonl = tmp_path / "l.jsonl"
    jsonl.write_text("".join(json.dumps({"image": r, "target": int(c)}) + "\n" for r, c in ints))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(jsonl.read_text() + json.dumps({"image": rows[11][0]}) + "\n")
    assert scan_list(broken, SAMPLE_DATA).skipped == [
        {"path": rows[11][0], "reason": "broken.jsonl line 11: no label"}
    ]
    tsv = write_csv(tmp_path / "l.tsv", ints, header=None, sep="\t")
    for scan in (scan_list(jsonl, SAMPLE_DATA), scan_list(tsv, SAMPLE_DATA, header=False)):
        assert [(i.rel, i.label) for i in scan.items] == [(r, int(c)) for r, c in ints]
        assert scan.classes == [str(i) for i in range(max(int(c) for _, c in ints) + 1)]
    classes_file = tmp_path / "c.txt"
    classes_file.write_text("\n".join(classes[:1]))  # only class 0 known: the rest are unknown
    scan = scan_list(jsonl, SAMPLE_DATA, classes_file)
    assert all(i.label == 0 for i in scan.items) and len(scan.skipped) == sum(c != "0" for _, c in ints)


def test_names_without_classes_file_sort_like_imagefolder(tmp_path):
    rows, classes = folder_rows()
    scan = scan_list(write_csv(tmp_path / "l.csv", list(reversed(rows))), SAMPLE_DATA)
    assert scan.classes == classes
    assert [i.rel for i in scan.items] == [r for r, _ in reversed(rows)]  # the list's order
    assert [scan.classes[i.label] for i in scan.items] == [c for _, c in reversed(rows)]


@pytest.mark.parametrize(
    "content, message",
    [
        ("a,b\nx,1\n", "cannot tell which column holds the path"),
        ("path,b\nx,1\n", "pass --label-column NAME"),
    ],
)
def test_unusable_lists_are_clear_errors(tmp_path, content, message):
    (tmp_path / "l.csv").write_text(content)
    with pytest.raises(ImgpackError, match=message):
        scan_list(tmp_path / "l.csv", SAMPLE_DATA)
    with pytest.raises(ImgpackError, match="name it .csv"):
        scan_list(tmp_path / "l.xlsx", SAMPLE_DATA)


def test_cli_records_row_skips_and_fails_on_request(tmp_path):
    rows, _ = folder_rows()
    listing = write_csv(tmp_path / "l.csv", [*rows[:4], ("people/missing.png", rows[0][1])])
    args = ["imagelist", str(listing), "--root", str(SAMPLE_DATA), "--to", "tfrecord", "--resize", "24", "-q"]
    result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(tmp_path / "a")
    assert manifest.num_samples == 4
    assert manifest.skipped == [
        {"path": "people/missing.png", "reason": f"l.csv line 6: file not found under {SAMPLE_DATA}"}
    ]
    result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "b"), "--on-error", "fail"])
    assert result.exit_code == 1 and "people/missing.png: l.csv line 6: file not found" in result.output
    assert not (tmp_path / "b").exists()


def test_pack_folder_accepts_a_scan(tmp_path):
    rows, _ = folder_rows()
    scan = scan_list(write_csv(tmp_path / "l.csv", rows[:5]), SAMPLE_DATA)
    report = pack_folder(scan, tmp_path / "out", "tar", PreprocessSpec(**SPEC), workers=1)
    assert report.packed == 5 and read_manifest(tmp_path / "out").extra["source"] == str(
        SAMPLE_DATA.resolve()
    )
