"""One read spec and one emission loop under open_iterable, mix and dali_loader.

Every reading path builds a ``readers.spec.ReadSpec`` and emits through
``readers.batch.record_stream``: the same options, the same errors at construction, the same batches,
augmentation and resume, whether the records come from one dataset, a mix or the DALI fallback.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from functools import partial

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import RandomResizedCrop, make_loader, mix, open_iterable
from readers.batch._whole_batch import WholeBatchCollatedError
from readers.dali import dali_loader
from readers.errors import ImgpackError, OptionError
from readers.spec import ReadSpec, entry_points
from tests.conftest import REPO
from tests.support.formats import formats_storing

FIXED = {"resize": 40, "crop": 32, "encode": "png"}
VARYING = {"resize": 36, "encode": "png"}  # shorter side 36: stored sizes differ
FORMATS = formats_storing(FIXED["encode"])  # every format that can takes part in the mix


@pytest.fixture
def paths(packed):
    return [packed(fmt, **FIXED) for fmt in FORMATS]


def taken(loader, limit=None):
    out = []
    for images, labels in loader:
        out.append((images.clone(), labels.clone()))
        if limit is not None and len(out) == limit:
            break
    return out


def assert_equal_batches(a, b):
    assert len(a) == len(b) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


# -- mix gets every reading knob of open_iterable ----------------------------------------------
def test_mix_takes_flip_shuffle_verify_and_the_other_knobs(paths):
    m = mix(
        paths,
        batch_size=16,
        crop=24,
        flip=True,
        shuffle=False,
        verify=True,
        fast_dct=True,
        decode_threads=2,
        seed=1,
    )
    images, labels = next(iter(DataLoader(m, batch_size=None)))
    assert images.shape == (16, 3, 24, 24) and labels.shape == (16,)
    assert all(r.verify for r in m.readers)


def test_mix_random_resized_crop_is_a_function_of_seed_epoch_and_position(paths):
    options = dict(batch_size=8, crop=RandomResizedCrop(20), flip=True, seed=3)
    first = taken(DataLoader(mix(paths, **options), batch_size=None))
    again = taken(DataLoader(mix(paths, **options), batch_size=None, num_workers=2))
    assert first[0][0].shape == (8, 3, 20, 20)
    assert_equal_batches(first, again)  # any worker count: the same crops
    other = mix(paths, **options)
    other.set_epoch(1)
    assert not torch.equal(taken(DataLoader(other, batch_size=None))[0][0], first[0][0])


def test_mix_refuses_a_crop_larger_than_the_smallest_stored_image_at_construction(paths, packed):
    with pytest.raises(OptionError, match="larger than the smallest stored image"):
        mix(paths, batch_size=4, crop=33)
    varying = packed("lmdb", **VARYING)
    with pytest.raises(OptionError, match="a batch needs images of one size"):
        mix([paths[0], varying], batch_size=4)


def test_mix_batches_refuse_a_collating_dataloader(paths):
    with pytest.raises(WholeBatchCollatedError, match="batch_size=None"):
        next(iter(DataLoader(mix(paths, batch_size=4))))


def test_mix_per_sample_path_applies_the_crop(paths):
    image, _ = next(iter(mix(paths, crop=16)))
    assert tuple(image.shape) == (3, 16, 16)


def test_mix_random_crop_resume_with_persistent_workers_is_exact(paths):
    options = dict(batch_size=6, crop=RandomResizedCrop(20, scale=(0.3, 1.0)), flip=True, seed=5)

    def loader():
        weights = [1, 2] + [1] * (len(paths) - 2)
        return make_loader(mix(paths, weights=weights, **options), num_workers=2, persistent_workers=True)

    first = loader()
    first.dataset.set_epoch(1)
    full = taken(first)
    partial = loader()
    partial.dataset.set_epoch(1)
    head = taken(partial, limit=4)
    state = partial.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert_equal_batches(head + taken(resumed), full)


# -- one spec, one message on every path ----------------------------------------------------
def refusal(call) -> str:
    with pytest.raises(OptionError) as info:
        call()
    return str(info.value)


def test_the_same_mistake_is_the_same_error_on_every_path(paths):
    path = paths[0]
    entry = {
        "open_iterable": lambda **kw: open_iterable(path, **kw),
        "mix": lambda **kw: mix([path], **kw),
        "dali_loader": lambda **kw: dali_loader(path, device="dataloader", num_workers=0, **kw),
    }
    mistakes = [
        dict(batch_size=4, crop=40),
        dict(batch_size=4, layout="NCHW"),
        dict(batch_size=4, crop=RandomResizedCrop(16), resize=24),
        dict(batch_size=4, flip=2),
        dict(batch_size=0),
        dict(batch_size=4, crop=(0, 3)),
    ]
    for kwargs in mistakes:
        messages = {name: refusal(partial(call, **kwargs)) for name, call in entry.items()}
        assert len(set(messages.values())) == 1, messages
    assert "larger than the smallest stored image" in refusal(
        lambda: open_iterable(path, batch_size=4, crop=40)
    )
    for kind in ("png", "jpeg"):  # an unknown decode kind, on both iterables and the map dataset
        assert refusal(partial(open_iterable, path, decode=kind)) == refusal(
            partial(mix, [path], decode=kind)
        )
    # An option a path does not take is refused naming the paths that take it.
    assert "applies to open_iterable and mix, not to dali_loader" in refusal(
        lambda: dali_loader(path, batch_size=4, decode_threads=2)
    )


def test_option_errors_are_imgpack_errors_and_still_value_errors(paths):
    for call in (
        lambda: open_iterable(paths[0], flip="often"),
        lambda: mix(paths, weights=[1, 1]),
        lambda: open_iterable(paths[0], decode_threads=2),
        lambda: RandomResizedCrop(16, scale=(0.5, 2.0)),
    ):
        with pytest.raises(ImgpackError) as info:
            call()
        assert isinstance(info.value, ValueError)


def test_signatures_are_keyword_only(paths):
    with pytest.raises(TypeError):
        open_iterable(paths[0], False)  # shuffle
    with pytest.raises(TypeError):
        mix(paths, [1, 1, 1])  # weights
    with pytest.raises(TypeError):
        dali_loader(paths[0], 4)  # batch_size
    for entry in (open_iterable, mix, dali_loader):
        params = list(inspect.signature(entry).parameters.values())
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"]
        assert positional in (["path"], ["paths"]), entry


def test_reading_docs_table_lists_every_option_with_its_paths():
    reading = (REPO / "docs" / "reading.md").read_text()
    table_text = reading.split("| option | taken by | what it does |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table_text, flags=re.M))
    table = {f.name for f in dataclasses.fields(ReadSpec)}
    assert set(rows) == table
    for name, paths in entry_points().items():
        marks = rows[name].strip()
        assert marks == ("all" if len(paths) == 4 else ", ".join(paths)), name


# -- the DALI CPU fallback is open_iterable -----------------------------------------------------
def test_dali_fallback_is_bit_identical_to_open_iterable_with_augmentation_and_resume(packed):
    path = packed("lmdb", resize=40, encode="jpeg")  # JPEG, sizes vary: the random windows differ
    options = dict(batch_size=8, crop=RandomResizedCrop(24), flip=True, seed=2)
    fallback = dali_loader(path, device="dataloader", num_workers=2, **options)
    assert fallback.backend == "dataloader"
    fallback.set_epoch(1)
    got = taken(fallback)
    stream = open_iterable(path, pad_last=True, **options)
    stream.set_epoch(1)
    want = taken(make_loader(stream, num_workers=2))
    assert len(got) == len(fallback) == 6  # 44 samples padded to 6 batches of 8
    assert_equal_batches(got, want)
    partial = dali_loader(path, device="dataloader", num_workers=2, **options)
    partial.set_epoch(1)
    head = taken(partial, limit=2)
    resumed = dali_loader(path, device="dataloader", num_workers=2, **options)
    resumed.load_state_dict(partial.state_dict())
    assert len(resumed) == 4
    assert_equal_batches(head + taken(resumed), got)


def test_pad_last_fills_the_last_batch_on_open_iterable_and_mix(paths):
    for stream in (
        open_iterable(paths[0], batch_size=8, pad_last=True),
        mix(paths[:1], batch_size=8, pad_last=True),
    ):
        sizes = [len(labels) for _, labels in DataLoader(stream, batch_size=None)]
        assert sizes == [8] * 6  # 44 samples, the last batch wrapped around
    assert (
        np.sum([len(y) for _, y in DataLoader(open_iterable(paths[0], batch_size=8), batch_size=None)]) == 44
    )
