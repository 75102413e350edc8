"""target="torchvision": the detection contract, tested without torchvision (CI cannot have it).

Each sample's target has torchvision's keys and dtypes, its boxes are the XYXY form of the boxes
``fields=["boxes"]`` returns for the same read (and of the map-style reader's stored boxes), labels
are the categories plus ``label_offset``; the batch path, the per-sample path and ``make_loader``
give the detection collate's two lists, and ``transform=`` receives ``(image, target)``.
scripts/check_torchvision.py runs a real detector and a transforms v2 pipeline on the same reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from packer.cli import main
from readers import RandomResizedCrop, make_loader, mix, open_dataset, open_iterable
from readers.errors import OptionError
from readers.fields.targets import tv_tensors
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import coco_pack_args, make_coco

KEYS = {"boxes", "labels", "image_id", "iscrowd", "area"}
FIELDS = ["boxes", "categories", "iscrowd", "image_id"]
READ = {"crop": RandomResizedCrop(48, scale=(0.3, 1.0)), "flip": True, "seed": 3}
FORMATS = formats_storing_fields()  # targets are made from the stored fields


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco")
    coco = make_coco(folder, count=40, empty=2)
    out = {}
    for fmt in FORMATS:
        dest = folder / fmt
        result = CliRunner().invoke(main, coco_pack_args(coco, fmt, dest, "--workers", "1", "-q"))
        assert result.exit_code == 0, result.output
        out[fmt] = dest
    return out


def xyxy(xywh) -> np.ndarray:
    boxes = np.asarray(xywh, np.float32).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)


def check_contract(image, target, fields, offset: int = 1) -> None:
    """``target`` is the torchvision form of the ``fields=`` target of the same sample."""
    assert KEYS <= set(target)
    assert isinstance(image, torch.Tensor) and image.dtype == torch.float32 and image.ndim == 3
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    boxes = target["boxes"]
    assert isinstance(boxes, torch.Tensor) and boxes.dtype == torch.float32 and boxes.shape[1:] == (4,)
    np.testing.assert_allclose(boxes.numpy(), xyxy(fields["boxes"]), atol=1e-4)
    assert target["labels"].dtype == torch.int64 and target["iscrowd"].dtype == torch.int64
    assert target["labels"].tolist() == (np.asarray(fields["categories"]) + offset).tolist()
    assert target["iscrowd"].tolist() == np.asarray(fields["iscrowd"]).tolist()
    assert target["image_id"] == fields["image_id"] and isinstance(target["image_id"], int)
    assert target["area"].dtype == torch.float32
    expected_area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    np.testing.assert_allclose(target["area"].numpy(), expected_area.numpy(), rtol=1e-5)
    if tv_tensors() is None:  # CI: plain tensors; with torchvision: its types (scripts/check_torchvision.py)
        assert type(boxes) is torch.Tensor


@pytest.mark.parametrize("fmt", FORMATS)
def test_per_sample_targets_are_the_xyxy_form_of_the_fields(packed, fmt):
    plain = list(open_iterable(packed[fmt], fields=FIELDS, **READ))
    shaped = list(open_iterable(packed[fmt], target="torchvision", **READ))
    assert len(plain) == len(shaped) == 40
    cropped = 0
    for (raw, fields), (image, target) in zip(plain, shaped):
        check_contract(image, target, fields)
        torch.testing.assert_close(image, raw.float() / 255)
        cropped += len(fields["boxes"]) > 0
    assert cropped >= 20  # the crops kept boxes to compare in most samples


def test_map_style_targets_match_the_stored_boxes(packed):
    plain = open_dataset(packed["lmdb"], decode="tensor", fields=FIELDS)
    shaped = open_dataset(packed["lmdb"], target="torchvision", label_offset=0)
    for index in range(len(plain)):
        raw, fields = plain[index]
        image, target = shaped[index]
        check_contract(image, target, fields, offset=0)
        assert target["boxes"].shape[0] == len(fields["boxes"])  # nothing dropped without a crop


def test_batch_path_gives_the_per_sample_targets_as_two_lists(packed):
    per_sample = list(open_iterable(packed["tar"], target="torchvision", **READ))
    batches = list(open_iterable(packed["tar"], target="torchvision", batch_size=8, **READ))
    images = [image for batch_images, _ in batches for image in batch_images]
    targets = [target for _, batch_targets in batches for target in batch_targets]
    assert all(isinstance(b[0], list) and isinstance(b[1], list) for b in batches)
    assert len(images) == len(targets) == len(per_sample)
    for (image, target), (want_image, want) in zip(zip(images, targets), per_sample):
        torch.testing.assert_close(image, want_image)
        assert set(target) == set(want)
        for key in ("boxes", "labels", "iscrowd", "area"):
            torch.testing.assert_close(target[key], want[key])
        assert target["image_id"] == want["image_id"]


@pytest.mark.parametrize("batched", [False, True])
def test_make_loader_with_workers_collates_for_detection(packed, batched):
    options = {"batch_size": 4} if batched else {}
    it = open_iterable(packed["lmdb"], target="torchvision", **READ, **options)
    loader = make_loader(it, num_workers=2, **({} if batched else {"batch_size": 4}))
    batches = list(loader)
    assert len(batches) == 10
    for images, targets in batches:
        assert isinstance(images, list) and isinstance(targets, list) and len(images) == len(targets) == 4
        for image, target in zip(images, targets):
            assert image.shape == (3, 48, 48) and image.dtype == torch.float32
            assert KEYS <= set(target) and target["boxes"].dtype == torch.float32


def test_transform_receives_image_and_target(packed):
    seen = []

    def mirror(image, target):
        """What a v2 pipeline does: both in, both out (a left-right flip of image and boxes)."""
        seen.append((image.dtype, image.shape, set(target)))
        boxes = target["boxes"].clone()
        boxes[:, [0, 2]] = image.shape[-1] - target["boxes"][:, [2, 0]]
        return image.flip(-1), {**target, "boxes": boxes}

    plain = list(open_iterable(packed["lmdb"], target="torchvision", **READ))
    flipped = list(open_iterable(packed["lmdb"], target="torchvision", transform=mirror, **READ))
    assert len(seen) == 40 and seen[0][0] == torch.uint8 and KEYS <= seen[0][2]  # before the float
    for (image, target), (mirrored, moved) in zip(plain, flipped):
        torch.testing.assert_close(mirrored, image.flip(-1))
        np.testing.assert_allclose(
            moved["boxes"][:, 0].numpy(), 48 - target["boxes"][:, 2].numpy(), atol=1e-5
        )


def test_other_fields_ride_beside_the_target(packed):
    image, target = next(
        iter(open_iterable(packed["lmdb"], target="torchvision", fields=["geometry"], **READ))
    )
    assert KEYS <= set(target) and target["geometry"]["out"] == (48, 48) and "label" not in target


def test_mix_reads_targets_from_every_dataset(packed):
    m = mix([packed[fmt] for fmt in FORMATS], target="torchvision", batch_size=4, **READ)
    batches = list(m)  # an epoch: each dataset's 40 samples (equal weights, equal sizes)
    assert all(len(images) == len(targets) == 4 for images, targets in batches)
    targets = [t for _, batch in batches for t in batch]
    assert len(targets) == 40 * len(FORMATS) and all(KEYS <= set(t) for t in targets)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"target": "coco"}, "use 'torchvision'"),
        ({"target": "torchvision", "label_offset": -1}, "label_offset=-1"),
        ({"target": "torchvision", "layout": "HWC"}, "CHW tensors"),
        ({"masks": True}, "also pass target="),
        ({"target": "torchvision", "masks": True}, "stores none"),
        ({"target": "torchvision", "batch_size": 4, "transform": lambda i, t: (i, t)}, "drop batch_size="),
    ],
)
def test_option_mistakes_name_the_fix(packed, options, message):
    with pytest.raises(OptionError, match=message):
        open_iterable(packed["lmdb"], crop=RandomResizedCrop(48), **options)


def test_a_dataset_without_boxes_is_refused_naming_its_fields(tmp_path):
    from tests.support.cocodata import draw_rectangles

    (tmp_path / "src" / "a").mkdir(parents=True)
    draw_rectangles(tmp_path / "src" / "a", 2)
    result = CliRunner().invoke(
        main, ["imagefolder", str(tmp_path / "src"), "--to", "lmdb", "-o", str(tmp_path / "d"), "-q"]
    )
    assert result.exit_code == 0, result.output
    with pytest.raises(OptionError, match="needs one boxes field"):
        open_iterable(tmp_path / "d", target="torchvision")
    with pytest.raises(OptionError, match="needs one boxes field"):
        open_dataset(tmp_path / "d", target="torchvision")
