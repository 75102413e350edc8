"""readers.datasets.mix over datasets with different fields: ``fields=`` names what every dataset stores,
``fields_per_dataset=`` reads each dataset's own; per sample, in batches from DataLoader workers,
with boxes following the crops, and resumed mid-epoch. Two packs of two formats from the registry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packer.scan.rows import Row, pack_rows
from readers import RandomResizedCrop, make_loader, mix, open_iterable
from readers.errors import OptionError
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import draw_rectangles, rect_of

N = 16
CAPTIONED, BOXED = formats_storing_fields()[0], formats_storing_fields()[-1]  # two formats
PER_DATASET = [["caption", "n"], ["boxes", "cats", "n"]]
CROP = RandomResizedCrop(48, scale=(0.6, 1.0))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> list[Path]:
    """Dataset 0 (one format): a caption and ``n``; dataset 1 (another): a box framing the drawn
    rectangle, its category and ``n`` (100 + i, so a sample says where it came from)."""
    root = draw_rectangles(tmp_path_factory.mktemp("mix-field-images"), N)
    out = tmp_path_factory.mktemp("mix-fields")
    captioned = [Row(f"{i:02d}.png", i % 2, {"caption": f"caption {i}", "n": i}) for i in range(N)]
    boxed = [Row(f"{i:02d}.png", i % 2, {"boxes": [list(rect_of(i))], "cats": [i % 4], "n": 100 + i})
             for i in range(N)]  # fmt: skip
    pack_rows(captioned, root, ["a", "b"], out / "captions", CAPTIONED, {"caption": "str", "n": "int"},
              workers=1, order="source")  # fmt: skip
    boxed_schema = {"boxes": "boxes", "cats": "box_ints", "n": "int"}
    pack_rows(boxed, root, ["a", "b"], out / "boxes", BOXED, boxed_schema, workers=1, order="source")
    return [out / "captions", out / "boxes"]


def rectangle_in(image: np.ndarray) -> tuple[float, float, float, float]:
    ys, xs = np.nonzero(image[..., 0] > 127)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())


def iou(a, b) -> float:
    w = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


def reader(datasets, **options):
    return mix(datasets, fields_per_dataset=PER_DATASET, crop=CROP, flip=0.5, seed=2, layout="HWC", **options)


def check_sample(image: np.ndarray, dataset: int, target: dict) -> tuple:
    """One sample's target checked against its dataset; returns it as plain values."""
    n = int(target["n"])
    if dataset == 0:
        assert 0 <= n < N and target["caption"] == f"caption {n}"
        return 0, n, target["caption"], []
    assert 100 <= n < 100 + N and target.get("caption") is None
    boxes = np.asarray(target["boxes"]).reshape(-1, 4)
    if len(boxes):  # the box frames the rectangle in the returned pixels
        assert iou(rectangle_in(image), boxes[0].tolist()) >= 0.8
        assert np.asarray(target["cats"]).tolist() == [(n - 100) % 4]
    else:  # cropped away: nothing bright left
        assert (image[..., 0] > 127).sum() < 20
    return 1, n, None, boxes.round(3).tolist()


def test_fields_must_be_stored_by_every_dataset_and_options_are_checked(datasets):
    lacking = r"dataset 1 \(.*boxes\) does not store 'caption'.*fields_per_dataset="
    with pytest.raises(OptionError, match=lacking):
        mix(datasets, batch_size=4, crop=40, fields=["caption", "n"])
    n = [t["n"].tolist() for _, t in mix(datasets, batch_size=4, crop=40, fields=["n"])]
    assert sorted(v for batch in n for v in batch) == [*range(N), *range(100, 100 + N)]
    with pytest.raises(OptionError, match=r"fields_per_dataset= for dataset 0 \(.*captions\).*'boxes'"):
        mix(datasets, crop=40, fields_per_dataset=[["boxes"], ["boxes"]])
    with pytest.raises(OptionError, match="1 lists for 2 datasets"):
        mix(datasets, crop=40, fields_per_dataset=[["n"]])
    with pytest.raises(OptionError, match="pass one of them"):
        mix(datasets, crop=40, fields=["n"], fields_per_dataset=PER_DATASET)
    with pytest.raises(OptionError, match="one list of field names per dataset"):
        mix(datasets, crop=40, fields_per_dataset={"a": ["n"]})
    with pytest.raises(OptionError, match="fields_per_dataset= applies to mix"):
        open_iterable(datasets[0], fields_per_dataset=PER_DATASET)


def test_per_sample_targets_carry_their_own_datasets_fields(datasets):
    seen = []
    for image, target in reader(datasets, decode="numpy"):
        dataset = target["dataset"]
        assert set(target) == {"label", "dataset", *PER_DATASET[dataset]}
        seen.append(check_sample(image, dataset, target))
    assert sorted(n for _, n, _, _ in seen) == [*range(N), *range(100, 100 + N)]
    assert sum(1 for _, _, _, boxes in seen if boxes) >= N // 2


def batch_samples(images, target) -> list[tuple]:
    """A batch's targets split back into samples (and checked)."""
    assert target["dataset"].dtype == torch.int64
    out = []
    for k, dataset in enumerate(target["dataset"].tolist()):
        count = int(target["boxes_count"][k]) if "boxes_count" in target else len(target["boxes"][k])
        sample = {
            "n": target["n"][k],
            "caption": target["caption"][k],
            "boxes": target["boxes"][k][:count],
            "cats": target["cats"][k][:count],
        }
        if dataset == 0:
            assert count == 0 and target["cats"][k][:count].numel() == 0
        out.append(check_sample(np.asarray(images[k]), dataset, sample))
    return out


@pytest.mark.parametrize("pad", [False, True])
def test_batches_from_workers_mix_datasets_and_equal_the_per_sample_path(datasets, pad):
    loader = make_loader(reader(datasets, batch_size=5, pad_fields=pad), num_workers=2)
    got = [s for images, target in loader for s in batch_samples(images, target)]
    alone = [check_sample(image, t["dataset"], t) for image, t in reader(datasets, decode="numpy")]
    assert got == alone
    assert {d for d, *_ in got} == {0, 1}


def test_resume_mid_epoch_with_persistent_workers(datasets):
    def loader():
        return make_loader(reader(datasets, batch_size=4), num_workers=2, persistent_workers=True)

    full = [s for images, t in loader() for s in batch_samples(images, t)]
    first = loader()
    stream = iter(first)
    head = [s for images, t in (next(stream), next(stream), next(stream)) for s in batch_samples(images, t)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [s for images, t in resumed for s in batch_samples(images, t)]
    assert head + tail == full and len(tail) > 0
