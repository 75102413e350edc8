"""``pack show``: the contact sheet shows the chosen samples as the readers decode them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from packer.info.show import BACKGROUND, CAPTION, GAP, contact_sheet, pick_samples
from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.image.decode import decode_array
from tests.conftest import run_cli

SOURCE_ORDER = ("--order", "source")  # these tests index samples in the source's order


def cell_of(sheet, slot, columns, cell):
    x = GAP + (slot % columns) * (cell + GAP)
    y = GAP + (slot // columns) * (cell + CAPTION + GAP)
    return np.asarray(sheet)[y : y + cell, x : x + cell], np.asarray(sheet)[
        y + cell : y + cell + CAPTION, x : x + cell
    ]


def test_picks_are_seeded_sorted_and_limited_to_classes():
    labels = np.repeat(np.arange(4), 10)
    classes = ["a", "b", "c", "d"]
    first = pick_samples(labels, classes, 8, seed=0)
    assert first.tolist() == pick_samples(labels, classes, 8, seed=0).tolist()
    assert first.tolist() != pick_samples(labels, classes, 8, seed=1).tolist()
    assert len(set(first.tolist())) == 8 and np.all(np.diff(labels[first]) >= 0)
    only = pick_samples(labels, classes, 50, seed=0, wanted=["b", "d"])
    assert sorted(only.tolist()) == list(range(10, 20)) + list(range(30, 40))
    with pytest.raises(ImgpackError, match="unknown class"):
        pick_samples(labels, classes, 5, 0, wanted=["zebra"])


@pytest.mark.parametrize("spec", [{"resize": 48}, {"resize": 40, "crop": 40, "encode": "raw", "mode": "L"}])
def test_cells_hold_the_decoded_samples_with_captions(packed, spec):
    root = packed("tfrecord", **spec)
    reader = open_reader(root)
    cell = 48
    sheet, chosen = contact_sheet(root, n=7, seed=3, cell=cell)
    columns = 3  # ceil(sqrt(7))
    assert sheet.size == (columns * (cell + GAP) + GAP, 3 * (cell + CAPTION + GAP) + GAP)
    for slot, index in enumerate(chosen.tolist()):
        expected = Image.fromarray(decode_array(reader.read(index)).squeeze()).convert("RGB")
        expected.thumbnail((cell, cell), Image.Resampling.BILINEAR)
        pixels, caption = cell_of(sheet, slot, columns, cell)
        top, left = (cell - expected.height) // 2, (cell - expected.width) // 2
        region = pixels[top : top + expected.height, left : left + expected.width]
        assert np.array_equal(region, np.asarray(expected))
        assert np.any(caption != BACKGROUND)  # the class name is written under it
    empty_pixels, empty_caption = cell_of(sheet, 8, columns, cell)
    assert np.all(empty_pixels == BACKGROUND) and np.all(empty_caption == BACKGROUND)


def test_cli_writes_a_png_and_refuses_bad_input(packed, tmp_path):
    root = packed("tfrecord", resize=48)
    out = tmp_path / "grid.png"
    proc = run_cli("show", root, "-o", out, "--n", "9", "--classes", "animals,people", "--seed", "2")
    assert proc.returncode == 0 and "9 images" in proc.stdout
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (
            3 * (128 + GAP) + GAP,
            3 * (128 + CAPTION + GAP) + GAP,
        )
    bad = run_cli("show", root, "-o", out, "--classes", "zebra")
    assert bad.returncode == 1 and "unknown class(es) zebra; the dataset has: animals" in bad.stderr
    assert run_cli("show", root, "-o", tmp_path / "grid.jpg").returncode == 1


def test_boxes_drawn_and_non_ascii_class_names_have_glyphs(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main
    from packer.info.show import BOX, caption_font
    from readers import open_dataset
    from tests.support.cocodata import coco_pack_args, make_coco

    coco = make_coco(tmp_path / "coco", count=12, empty=0)
    out = tmp_path / "coco.lmdb"
    assert CliRunner().invoke(main, coco_pack_args(coco, "lmdb", out, "-q", *SOURCE_ORDER)).exit_code == 0
    sheet, chosen = contact_sheet(out, n=4, cell=128)
    pixels = np.asarray(sheet)
    outlined = np.all(pixels == BOX, axis=2)
    assert outlined.sum() > 4 * 40  # every thumbnail has at least one box outlined
    # The first cell's box outline sits where the box is, scaled to the thumbnail.
    ds = open_dataset(out, fields=["boxes"])
    _, target = ds[int(chosen[0])]
    image = np.asarray(ds[int(chosen[0])][0])
    h, w = image.shape[:2]
    scale = min(1.0, 128 / h, 128 / w)  # thumbnails only shrink
    left = GAP + (128 - round(w * scale)) // 2
    top = GAP + (128 - round(h * scale)) // 2
    x, y = target["boxes"][0][:2]
    row, column = round(top + y * scale), round(left + x * scale)
    assert outlined[row - 1 : row + 2, column - 1 : column + 2].any()
    font = caption_font()

    def mask(text: str) -> bytes:
        return np.asarray(font.getmask(text)).tobytes()

    assert mask("é") != mask("\u0378") and mask("é") != mask("e")  # a glyph, not the missing-glyph box


def test_captions_drawn_under_the_class_line(tmp_path):
    from packer.scan.rows import Row, pack_rows
    from tests.conftest import SAMPLE_DATA

    files = sorted(p for p in SAMPLE_DATA.rglob("*.jpg"))[:4]
    names = [str(p.relative_to(SAMPLE_DATA)) for p in files]
    rows = [Row(name, 0, {"caption": f"légende n°{i}"}) for i, name in enumerate(names)]
    pack_rows(rows, SAMPLE_DATA, ["a"], tmp_path / "caps", "lmdb", workers=1, order="source")
    without = [Row(r.path, 0, {}) for r in rows]
    pack_rows(without, SAMPLE_DATA, ["a"], tmp_path / "plain", "lmdb", {}, workers=1, order="source")
    cell = 64
    with_text, _ = contact_sheet(tmp_path / "caps", n=4, cell=cell)
    plain, _ = contact_sheet(tmp_path / "plain", n=4, cell=cell)
    assert with_text.height == plain.height + 2 * CAPTION  # a second line under each of 2 rows
    second_line = np.asarray(with_text)[GAP + cell + CAPTION : GAP + cell + 2 * CAPTION, GAP : GAP + cell]
    assert (second_line.max(axis=2) > 150).sum() > 20  # the caption's text is drawn there
