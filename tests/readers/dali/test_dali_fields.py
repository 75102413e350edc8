"""fields= on the real DALI pipeline (CPU here): the same targets as the DataLoader path, sample for sample.

A COCO set (tests/support/cocodata.py) is packed with boxes, per-box categories and a non-ASCII caption
into every format that stores fields, and read by ``dali_loader(device="cpu")`` (a real DALI
pipeline, ``device_id=None``) and by ``device="dataloader"`` (``open_iterable`` + ``make_loader``)
with the same options. Boxes must be *equal*, not close: both paths move them with the same code
(``readers.batch.record_stream.batch_fields``) through the same integer windows and flips (a function of
(seed, epoch, sample index)); only the pixels differ, by DALI's resampler (the tolerance of
test_dali.py). That boxes frame what DALI's pixels show is tests/readers/fields/test_boxes_read.py's
check.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from packer.scan.rows import Row, pack_rows
from readers import RandomResizedCrop
from readers.dali import dali_loader
from readers.dali._fields import carried, stored_fields
from readers.errors import OptionError
from readers.fields.field_schema import KINDS, typed
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import formats_storing_fields
from readers.store.record import Record
from tests.support.cocodata import CLASSES, make_coco

SCHEMA = {"boxes": "boxes", "categories": "box_ints", "caption": "str"}
FIELDS = list(SCHEMA)
COUNT = 70
TRAIN = {"crop": RandomResizedCrop(40, scale=(0.2, 1.0)), "flip": True}


@pytest.fixture(scope="module")
def coco_rows(tmp_path_factory):
    """The COCO set as rows with boxes, categories (indices into CLASSES) and a caption."""
    source = make_coco(tmp_path_factory.mktemp("coco"), count=COUNT, empty=3)
    coco = json.loads(source.read_text())
    ids = sorted(c["id"] for c in coco["categories"])
    rows = []
    for image in coco["images"]:
        annotations = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
        fields = {
            "boxes": [a["bbox"] for a in annotations],
            "categories": [ids.index(a["category_id"]) for a in annotations],
            "caption": f"image n°{image['id']} – été",
        }
        rows.append(Row(image["file_name"], -1, fields, image["file_name"]))
    return source.parent / "images", rows


@pytest.fixture(scope="module")
def packed_fields(coco_rows, tmp_path_factory):
    """fmt -> the rows packed to that format (once per module)."""
    root, rows = coco_rows
    made = {}

    def make(fmt: str):
        if fmt not in made:
            out = tmp_path_factory.mktemp("fields") / fmt
            pack_rows(rows, root, CLASSES, out, fmt, SCHEMA, spec=PreprocessSpec(encode="jpeg"), workers=1)
            made[fmt] = out
        return made[fmt]

    return make


def batches(loader) -> list:
    return [(images.cpu().clone(), target) for images, target in loader]


def assert_same_targets(dali: list, reference: list, mad: float = 3.0) -> int:
    """Equal targets batch for batch (and pixels within DALI's resampling); returns the box count."""
    assert len(dali) == len(reference) > 0
    boxes = 0
    for (xa, ta), (xb, tb) in zip(dali, reference):
        assert set(ta) == set(tb)
        assert xa.shape == xb.shape and (xa.float() - xb.float()).abs().mean().item() <= mad
        for name, value in tb.items():
            got = ta[name]
            if isinstance(value, torch.Tensor):
                assert torch.equal(got.cpu(), value), name
            elif value and isinstance(value[0], torch.Tensor):
                assert len(got) == len(value) and all(torch.equal(p, q) for p, q in zip(got, value)), name
            else:
                assert got == value, name
        padded = not isinstance(tb["boxes"], list)
        boxes += int(tb["boxes_count"].sum()) if padded else sum(len(b) for b in tb["boxes"])
    return boxes


def loaders(path, **options):
    kwargs = {"batch_size": 16, "seed": 4, "fields": FIELDS, **TRAIN, **options}
    py_workers = kwargs.pop("py_workers", 0)
    return (
        dali_loader(path, device="cpu", py_workers=py_workers, **kwargs),
        dali_loader(path, device="dataloader", num_workers=2, **kwargs),
    )


@pytest.mark.parametrize("py_workers", [0, 2])
@pytest.mark.parametrize("fmt", formats_storing_fields())
def test_dali_pipeline_fields_match_the_dataloader_path_and_resume(packed_fields, fmt, py_workers):
    path = packed_fields(fmt)
    dali, fallback = loaders(path, py_workers=py_workers)
    assert dali.backend == "dali-cpu" and fallback.backend == "dataloader"
    dali.set_epoch(1)
    fallback.set_epoch(1)
    full, reference = batches(dali), batches(fallback)
    assert len(full) == 5  # 70 samples: the last batch padded with samples from the epoch's start
    assert full[0][1]["caption"][0].endswith("– été")
    assert assert_same_targets(full, reference) > 60
    # Resume mid-epoch from the DALI loader's own state: the rest of the epoch, the same targets.
    dali.set_epoch(1)
    for i, _ in enumerate(dali):
        if i == 1:
            break
    state = dali.state_dict()
    resumed, _ = loaders(path, py_workers=py_workers)
    resumed.load_state_dict(state)
    assert assert_same_targets(batches(resumed), reference[2:]) > 20


POLICIES = {"pad": {}, "drop": {"drop_last": True}, "partial": {"pad_last": False}}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_centre_path_padded_fields_geometry_and_last_batch_policies(packed_fields, policy):
    path = packed_fields(formats_storing_fields()[0])
    options = {
        "crop": 48, "resize": 56, "flip": 0.5, "pad_fields": True, "min_visibility": 0.4,
        "fields": [*FIELDS, "geometry"], "batch_size": 12, "rank": 1, "world_size": 2,
        **POLICIES[policy],
    }  # fmt: skip
    dali, fallback = loaders(path, **options)
    got, reference = batches(dali), batches(fallback)
    sizes = [len(images) for images, _ in got]
    # rank 1 of 2 holds 35 samples: 3 batches of 12 (the last padded), or 2 (drop), or 12, 12, 11
    assert sizes == {"pad": [12, 12, 12], "drop": [12, 12], "partial": [12, 12, 11]}[policy]
    assert assert_same_targets(got, reference) > 20
    target = got[-1][1]
    assert target["boxes"].shape[0] == sizes[-1] and target["boxes"].shape[2] == 4
    geometry = target["geometry"][0]
    assert geometry["out"] == (48, 48) and len(geometry["window"]) == 4
    assert any(g["flip"] for _, t in got for g in t["geometry"])
    assert not all(g["flip"] for _, t in got for g in t["geometry"])


def test_geometry_alone(packed_fields):
    path = packed_fields(formats_storing_fields()[0])
    dali, fallback = loaders(path, fields=["geometry"], py_workers=2)
    got, reference = batches(dali), batches(fallback)
    assert set(got[0][1]) == {"label", "geometry"}
    assert [t["geometry"] for _, t in got] == [t["geometry"] for _, t in reference]
    assert got[0][1]["geometry"][0]["out"] == (40, 40)


def test_a_field_the_dataset_does_not_store_is_refused_on_every_path(packed_fields):
    path = packed_fields(formats_storing_fields()[0])
    for device in ("cpu", "dataloader"):  # when the loader is built, with the same message
        with pytest.raises(OptionError, match=r"fields= names 'nope', not stored.*boxes, caption"):
            dali_loader(path, batch_size=8, device=device, crop=32, fields=["boxes", "nope"])


def test_every_field_kind_crosses_the_pipeline_exactly():
    """carried() -> stored_fields() (what the feed sends, what this process reads back) gives the
    reader's typed values for every kind, unset values and numbers beyond int64/float32 included."""
    schema = dict(zip(KINDS, KINDS))
    samples = [
        {"int": 2**70, "float": 0.1, "str": "é – 字", "ints": [1, -2**62], "floats": [0.5, 1e-7],
         "json": {"a": [1, None, "x"]}, "boxes": [[0.1, 2.5, 3.0, 4.25]], "box_ints": [7]},
        {"str": "", "boxes": [], "box_ints": []},  # the rest unset
    ]  # fmt: skip
    records = [Record(b"", -1, 20 + i, 30, 3, "jpeg", typed(schema, v)) for i, v in enumerate(samples)]
    rows, lengths, geometry = carried(records, schema, np.arange(8).reshape(2, 4), np.array([True, False]))
    assert geometry.tolist() == [[20, 30, 0, 1, 2, 3, 1], [21, 30, 4, 5, 6, 7, 0]]
    for record, row, sizes in zip(records, rows, lengths.tolist()):
        back = stored_fields(schema, row.tobytes(), sizes)
        for name, value in record.fields.items():
            if isinstance(value, np.ndarray):
                assert back[name].dtype == value.dtype and back[name].shape == value.shape
                np.testing.assert_array_equal(back[name], value)
            else:
                assert back[name] == value and type(back[name]) is type(value), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_pipeline_fields_match_the_cpu_pipeline(packed_fields):
    path = packed_fields(formats_storing_fields()[0])
    kwargs = {"batch_size": 16, "seed": 4, "fields": FIELDS, **TRAIN}
    gpu = dali_loader(path, device="gpu", **kwargs)
    first_images, first_target = next(iter(gpu))
    assert first_images.is_cuda and first_target["label"].is_cuda
    assert not first_target["boxes"][0].is_cuda  # moved in Python, on the CPU
    got = batches(dali_loader(path, device="gpu", **kwargs))
    reference = batches(dali_loader(path, device="cpu", **kwargs))
    assert assert_same_targets(got, reference, mad=2.0) > 60  # nvJPEG's rounding: test_dali_gpu.py
