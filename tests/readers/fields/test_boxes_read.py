"""Boxes follow the image on every reading path and every registered format: a COCO set with its
boxes drawn into the pixels (tests/support/cocodata.py) is packed, read back with resize, centre crop,
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
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import coco_pack_args, colour_of, find_rectangle, iou, make_coco

SOURCE_ORDER = ("--order", "source")  # these tests index samples in the source's order

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
        args = coco_pack_args(coco, fmt, dest, *SOURCE_ORDER, "--workers", "1", "-q")
        result = CliRunner().invoke(main, args)
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


@pytest.mark.parametrize("py_workers", [0, 2])
@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_dali_pipeline_boxes_frame_the_rectangles_in_its_pixels(packed, fmt, read, py_workers):
    """The real DALI pipeline (CPU): its own decode, slice, resize and flip made the pixels; the
    boxes, moved in Python by the windows and flips it was fed, must frame what they show."""
    loader = dali_loader(
        packed[fmt], batch_size=16, device="cpu", py_workers=py_workers, layout="HWC", seed=7,
        pad_last=False, fields=FIELDS, **READS[read],
    )  # fmt: skip
    assert loader.backend == "dali-cpu"
    compared = seen = 0
    for images, target in loader:
        assert images.dtype == torch.uint8 and len(target["boxes"]) == len(images)
        for i in range(len(images)):
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
        seen += len(images)
    assert seen == 200 and compared >= 200


def test_min_visibility_drops_mostly_cut_boxes(packed):
    fmt = formats_storing_fields()[0]
    read = {"crop": RandomResizedCrop(40, scale=(0.08, 0.3)), "seed": 2}
    kept_all = sum(len(t["boxes"]) for _, t in open_iterable(packed[fmt], fields=FIELDS, **read))
    kept_half = sum(
        len(t["boxes"]) for _, t in open_iterable(packed[fmt], fields=FIELDS, min_visibility=0.5, **read)
    )
    assert 0 < kept_half < kept_all


def _tfrecord_boxes(xmin, ymin, xmax, ymax, height, width) -> np.ndarray:
    corners = np.stack([np.asarray(v, np.float64).reshape(-1) for v in (xmin, ymin, xmax, ymax)], axis=1)
    x0, y0, x1, y1 = (corners[:, k] * (width if k % 2 == 0 else height) for k in range(4))
    return np.stack([x0, y0, x1 - x0, y1 - y0], axis=1)


@pytest.fixture(scope="module")
def coco_tfrecord(coco, tmp_path_factory):
    """The COCO set packed to TFRecord with --resize 80 (boxes moved at pack time), small shards;
    PNG, so a re-encoded JPEG's chroma blur does not move the rectangles' found edges."""
    dest = tmp_path_factory.mktemp("tfr") / "tfr"
    options = ["--resize", "80", "--encode", "png", "--samples-per-shard", "64", "-q"]
    result = CliRunner().invoke(main, coco_pack_args(coco, "tfrecord", dest, *SOURCE_ORDER, *options))
    assert result.exit_code == 0, result.output
    records = sorted(dest.glob("*.tfrecord"))
    return dest, [str(p) for p in records], [str(p.with_suffix(".idx")) for p in records]


def test_tfrecord_boxes_parse_with_the_tfrecord_package(coco_tfrecord):
    from PIL import Image
    from tfrecord.reader import tfrecord_loader

    dest, records, _ = coco_tfrecord
    ours = open_dataset(dest, decode="numpy", fields=FIELDS)
    examples = [example for record in records for example in tfrecord_loader(record, None)]
    assert len(examples) == len(ours) == 200
    compared = 0
    for index, example in enumerate(examples):
        image, target = ours[index]
        height, width = int(example["image/height"][0]), int(example["image/width"][0])
        assert (height, width) == image.shape[:2]
        keys = [f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax")]
        boxes = _tfrecord_boxes(*(example.get(k, []) for k in keys), height, width)
        np.testing.assert_allclose(boxes, target["boxes"], atol=1e-3)
        # the TF Object Detection API's convention: labels from 1 (0 is the background)
        labels = np.asarray(example.get("image/object/class/label", []), np.int64).reshape(-1) - 1
        assert labels.tolist() == target["categories"].tolist()
        pixels = np.asarray(
            Image.open(__import__("io").BytesIO(bytes(example["image/encoded"]))).convert("RGB")
        )
        compared += check_frames(
            pixels, {"boxes": boxes.astype(np.float32), "categories": labels, "iscrowd": labels}
        )
    assert compared >= 250


def test_tfrecord_boxes_parse_with_dali(coco_tfrecord):
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, pipeline_def

    dest, records, indexes = coco_tfrecord
    ours = open_dataset(dest, fields=FIELDS)

    @pipeline_def(batch_size=8, num_threads=1, device_id=None, seed=0)
    def pipe():
        inputs = fn.readers.tfrecord(
            path=records,
            index_path=indexes,
            features={
                **{
                    f"image/object/bbox/{k}": tfrec.VarLenFeature(tfrec.float32, 0.0)
                    for k in ("xmin", "ymin", "xmax", "ymax")
                },
                "image/object/class/label": tfrec.VarLenFeature(tfrec.int64, -1),
                "image/height": tfrec.FixedLenFeature([1], tfrec.int64, -1),
                "image/width": tfrec.FixedLenFeature([1], tfrec.int64, -1),
            },
            name="tfr",
        )
        keys = ["xmin", "ymin", "xmax", "ymax"]
        return (*(inputs[f"image/object/bbox/{k}"] for k in keys), inputs["image/object/class/label"],
                inputs["image/height"], inputs["image/width"])  # fmt: skip

    pipeline = pipe()
    pipeline.build()
    seen = 0
    while seen < len(ours):
        outputs = pipeline.run()
        for k in range(len(outputs[0])):
            if seen == len(ours):
                break
            xmin, ymin, xmax, ymax, labels, height, width = (np.array(o[k]) for o in outputs)
            boxes = _tfrecord_boxes(xmin, ymin, xmax, ymax, int(height[0]), int(width[0]))
            _, target = ours[seen]
            np.testing.assert_allclose(boxes, target["boxes"], atol=1e-3)
            assert (labels.reshape(-1) - 1).tolist() == target["categories"].tolist()
            seen += 1
    assert seen == 200
