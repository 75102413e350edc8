"""Boxes follow the image on every reading path and every registered format: a COCO set with its
boxes drawn into the pixels (tests/cocodata.py) is packed, read back with resize, centre crop,
RandomResizedCrop and flip, and every returned box must frame its rectangle as found in the
returned pixels (IoU >= 0.9)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from packer.cli import main
from readers import RandomResizedCrop, make_loader, open_dataset, open_iterable
from readers.dali import dali_loader
from readers.formats.registry import format_names, formats_storing_fields
from tests.cocodata import colour_of, find_rectangle, iou, make_coco

FIELDS = ["boxes", "categories", "iscrowd", "image_id"]
MIN_SIDE = 6  # rectangles thinner than this in the output are slivers whose found edges blur


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco"), count=200, empty=4)


@pytest.fixture(scope="module")
def packed(coco, tmp_path_factory):
    """Every registered format that stores fields, packed from the same COCO file."""
    out = {}
    for fmt in formats_storing_fields():
        dest = tmp_path_factory.mktemp("packed") / fmt
        args = ["coco", str(coco), "--root", str(coco.parent / "images"), "--to", fmt, "-o", str(dest)]
        result = CliRunner().invoke(main, [*args, "--workers", "1", "-q"])
        assert result.exit_code == 0, result.output
        out[fmt] = dest
    return out


def check_frames(image, target) -> int:
    """Each returned box frames its category's rectangle in ``image``; a rectangle visible in the
    image has its box. Returns the number of boxes compared."""
    pixels = np.asarray(image.numpy() if isinstance(image, torch.Tensor) else image)
    boxes = np.asarray(target["boxes"]).reshape(-1, 4)
    categories = np.asarray(target["categories"]).reshape(-1)
    assert boxes.dtype == np.float32 and len(categories) == len(boxes)
    assert len(np.asarray(target["iscrowd"]).reshape(-1)) == len(boxes)
    compared = 0
    for box, category in zip(boxes, categories):
        found = find_rectangle(pixels, colour_of(int(category)))
        if found is None or min(found[2:]) < MIN_SIDE:
            assert box[2] * box[3] <= max(16, 0 if found is None else 4 * found[2] * found[3])
            continue
        assert iou(box, found) >= 0.9, (box, found)
        compared += 1
    for index in range(3):
        found = find_rectangle(pixels, colour_of(index))
        if found is not None and min(found[2:]) >= MIN_SIDE:
            assert index in categories.tolist(), (index, found, categories)
    return compared


def test_formats_without_fields_refuse_naming_the_fix(coco, tmp_path):
    for fmt in sorted(set(format_names()) - set(formats_storing_fields())):
        args = [
            "coco",
            str(coco),
            "--root",
            str(coco.parent / "images"),
            "--to",
            fmt,
            "-o",
            str(tmp_path / fmt),
        ]
        result = CliRunner().invoke(main, [*args, "-q"])
        assert result.exit_code == 1 and "does not store per-sample fields" in result.output


@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_map_style_boxes_frame_the_stored_rectangles(packed, fmt):
    ds = open_dataset(packed[fmt], decode="numpy", fields=FIELDS)
    compared = 0
    for index in range(len(ds)):
        image, target = ds[index]
        assert set(target) == {"label", *FIELDS}
        compared += check_frames(image, target)
    assert compared >= 250


READS = {
    "rrc-flip": {"crop": RandomResizedCrop(48, scale=(0.25, 1.0)), "flip": True},
    "resize-crop-flip": {"resize": 64, "crop": 56, "flip": True},
    "resize": {"resize": (50, 70)},
}


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_per_sample_path_boxes_follow_the_geometry(packed, fmt, read):
    it = open_iterable(packed[fmt], shuffle=True, seed=3, fields=[*FIELDS, "geometry"], **READS[read])
    compared = flipped = 0
    for image, target in it:
        compared += check_frames(image, target)
        flipped += bool(target["geometry"]["flip"])
    assert compared >= 200
    assert (flipped > 40) == ("flip" in READS[read])


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_batch_path_boxes_follow_the_geometry(packed, fmt, read):
    it = open_iterable(packed[fmt], shuffle=True, seed=5, batch_size=16, fields=FIELDS, **READS[read])
    loader = make_loader(it, num_workers=2)
    compared = seen = 0
    for images, target in loader:
        assert isinstance(target["boxes"], list) and len(target["boxes"]) == len(images)
        for i in range(len(images)):
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
        seen += len(images)
    assert seen == 200 and compared >= 200


@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_padded_batches_match_the_lists(packed, fmt):
    read = {"crop": RandomResizedCrop(40), "flip": True, "seed": 1, "batch_size": 8}
    lists = open_iterable(packed[fmt], fields=FIELDS, **read)
    padded = open_iterable(packed[fmt], fields=FIELDS, pad_fields=True, **read)
    for (_, a), (_, b) in zip(lists, padded):
        counts = b["boxes_count"].tolist()
        for i, boxes in enumerate(a["boxes"]):
            assert counts[i] == len(boxes)
            torch.testing.assert_close(b["boxes"][i, : counts[i]], boxes)
            assert (b["categories"][i, counts[i] :] == -1).all()


@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_dali_fallback_boxes_follow_the_geometry(packed, fmt):
    loader = dali_loader(
        packed[fmt], batch_size=16, device="dataloader", num_workers=1, fields=FIELDS, **READS["rrc-flip"]
    )
    compared = 0
    for images, target in loader:
        for i in range(len(images)):
            if isinstance(images, torch.Tensor) and images.dtype != torch.uint8:
                pytest.fail(f"the fallback returned {images.dtype} images without mean/std")
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
    assert compared >= 200


def test_min_visibility_drops_mostly_cut_boxes(packed):
    fmt = formats_storing_fields()[0]
    read = {"crop": RandomResizedCrop(40, scale=(0.08, 0.3)), "seed": 2}
    kept_all = sum(len(t["boxes"]) for _, t in open_iterable(packed[fmt], fields=FIELDS, **read))
    kept_half = sum(
        len(t["boxes"]) for _, t in open_iterable(packed[fmt], fields=FIELDS, min_visibility=0.5, **read)
    )
    assert 0 < kept_half < kept_all
