"""Images the packer cannot take are recorded skips with a reason: an upscale past --max-pixels, a
decoder error without a message, a NUL byte in a source path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from readers import read_manifest
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.cli import write_images

# -- --upscale bounded by --max-pixels on the result -----------------------------------


def test_upscaling_a_thin_strip_past_max_pixels_is_a_skip_with_a_reason(tmp_path):
    src = write_images(tmp_path / "src" / "c", ["ok.png"], size=(40, 40))
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
    from packer.transform import preprocess
    from readers.formats.packed_sample import PreprocessSpec

    src = write_images(tmp_path / "c", ["a.png"])

    def out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(preprocess, "_encode", out_of_memory)
    with pytest.raises(preprocess.SkipSample, match="^cannot decode image: MemoryError$"):
        preprocess.preprocess_file(str(src / "a.png"), "a.png", 0, 0, PreprocessSpec(encode="png"))


# -- a NUL byte in a source path is a recorded skip ---------------------------------------
def test_a_nul_byte_in_an_imagelist_path_is_a_recorded_skip(tmp_path):
    from packer.sources.imagelist import scan_list

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
    from packer.sources.coco import coco_source
    from tests.support.cocodata import make_coco

    annotations = make_coco(tmp_path, count=3, empty=0)
    data = json.loads(annotations.read_text())
    data["images"][1]["file_name"] = "a\0b.jpg"
    annotations.write_text(json.dumps(data))
    scan = coco_source(annotations, tmp_path / "images")
    assert len(scan.items) == 2
    assert any("NUL byte" in s["reason"] and "images[1]" in s["reason"] for s in scan.skipped)
