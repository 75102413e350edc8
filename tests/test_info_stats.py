"""``pack info``: stored size range, upscaled count and a summary of skip reasons."""

from __future__ import annotations

from PIL import Image, ImageOps

from packer.preprocess import PreprocessSpec, target_size
from packer.source import scan_folder
from packer.stats import reason_summary
from readers import read_manifest
from readers.formats import open_reader
from tests.conftest import SAMPLE_DATA, run_cli


def test_stored_sizes_and_upscaled_count_match_the_records(packed):
    # Sources under 256 px are kept (no --upscale), then scaled up to cover the 240 crop.
    spec = {"resize": 256, "crop": 240}
    root = packed("tfrecord", options={"samples_per_shard": 9}, **spec)
    reader = open_reader(root)
    stored = read_manifest(root).extra["stored"]
    records = [reader.read(i) for i in range(len(reader))]
    assert stored["count"] == len(records)
    assert (stored["min_height"], stored["max_height"]) == (
        min(r.height for r in records),
        max(r.height for r in records),
    )
    assert (stored["min_width"], stored["max_width"]) == (
        min(r.width for r in records),
        max(r.width for r in records),
    )
    expected = 0
    skipped = {s["path"] for s in read_manifest(root).skipped}
    for item in scan_folder(SAMPLE_DATA).items:
        if item.rel in skipped:
            continue
        with Image.open(item.path) as img:
            w, h = ImageOps.exif_transpose(img).size
        tw, th = target_size(w, h, PreprocessSpec(**spec))
        expected += tw * th > w * h
    assert stored["upscaled"] == expected > 0
    proc = run_cli("info", root, check=True)
    assert f"stored    {stored['min_height']}-{stored['max_height']} x" in proc.stdout
    assert f"{expected} upscaled by the resize" in proc.stdout


def test_reason_summary_groups_reasons():
    skipped = [
        {"path": "a", "reason": "l.csv line 3: file not found under /x"},
        {"path": "b", "reason": "l.csv line 9: file not found under /x"},
        {"path": "c", "reason": "cannot decode image: broken data stream"},
        {"path": "d", "reason": "empty file (0 bytes)"},
        {"path": "e", "reason": "empty file (0 bytes)"},
        {"path": "f", "reason": "l.csv line 4: unknown label 'zebra' (5 classes)"},
    ]
    assert reason_summary(skipped) == [
        ("file not found under /x", 2),
        ("empty file", 2),
        ("cannot decode image", 1),
        ("unknown label", 1),
    ]
