"""A read has one geometry: its crop is normalised once (by ``ReadSpec``) and fit-checked once
(by ``Geometry.of``, against the stored sizes), however many batches, paths and consumers follow;
the DALI feed and the DALI fields share the one ``Geometry`` object."""

from __future__ import annotations

import json
import sys

import pytest

import readers.image.geometry
from readers import TokenBudget, mix, open_iterable
from readers.bucketing.bucket_geometry import TokenGeometry
from readers.dali import dali_loader
from readers.errors import OptionError
from readers.image.geometry import Geometry
from readers.spec import ReadSpec

RAW = {"resize": 48, "encode": "raw"}  # stored at several aspect ratios, shorter side 48


@pytest.fixture
def counted(monkeypatch):
    """calls["normalise"], calls["fit"]: how often a crop was normalised (``as_pair(..., "crop")``)
    and fit-checked (``crop_fits``), wherever a ``readers`` module imported them from."""
    calls = {"normalise": 0, "fit": 0}
    as_pair, crop_fits = readers.image.geometry.as_pair, readers.image.geometry.crop_fits

    def counting_as_pair(value, name):
        calls["normalise"] += name == "crop"
        return as_pair(value, name)

    def counting_crop_fits(*args):
        calls["fit"] += 1
        return crop_fits(*args)

    counters = (("as_pair", as_pair, counting_as_pair), ("crop_fits", crop_fits, counting_crop_fits))
    for module in [m for name, m in sys.modules.items() if name.startswith("readers")]:
        for name, original, counter in counters:
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counter)
    return calls


BOXES = {"fields": ["geometry"]}  # the geometry boxes follow, per sample, on every path
READS = {
    "batches": lambda path: open_iterable(path, batch_size=8, crop=40, flip=0.5, **BOXES),
    "samples": lambda path: open_iterable(path, crop=40, **BOXES),
    "mix": lambda path: mix([path], batch_size=8, crop=(40, 36)),
    "dali-cpu": lambda path: dali_loader(path, batch_size=8, crop=40, flip=0.5, device="cpu", **BOXES),
    "fallback": lambda path: dali_loader(path, batch_size=8, crop=40, device="dataloader", num_workers=0),
}


@pytest.mark.parametrize("read", READS)
def test_a_crop_is_normalised_and_fit_checked_once_per_loader(packed, counted, read):
    path = packed("lmdb", **RAW)
    loader = READS[read](path)
    for epoch in range(2):  # every batch of two epochs: the placements come from the one geometry
        loader.set_epoch(epoch)
        items = list(loader)
        assert items
    assert counted == {"normalise": 1, "fit": 1}, read


def test_the_dali_feed_and_fields_share_one_geometry(packed):
    path = packed("lmdb", **RAW)
    loader = dali_loader(path, batch_size=8, crop=40, flip=0.5, device="cpu", fields=["geometry"])
    assert isinstance(loader.feed.geometry, Geometry)
    assert loader.fields.geometry is loader.feed.geometry
    _, target = next(iter(loader))
    fallback = dali_loader(path, batch_size=8, crop=40, flip=0.5, device="dataloader", num_workers=0, **BOXES)
    _, want = next(iter(fallback))
    got, want = json.loads(json.dumps(target["geometry"])), json.loads(json.dumps(want["geometry"]))
    assert got == want  # the same windows and flips, sample for sample (tuples or lists)
    assert len({g["flip"] for g in want}) == 2  # (flip=0.5: some mirrored, some not)


def test_without_stored_sizes_each_size_is_checked_once(counted):
    # A dataset packed before stored sizes were recorded: the crop is checked per stored size met
    # (once each, memoised), and a size too small is still refused naming the fix.
    geometry = ReadSpec(batch_size=8, crop=40).geometry([("old.lmdb", None)])
    assert not geometry.fits_all and counted == {"normalise": 1, "fit": 0}
    for _ in range(3):
        assert geometry.placement(48, 60) == ((48, 60), 4, 10, (40, 40))
    geometry.placement(60, 48)
    assert counted["fit"] == 2
    with pytest.raises(OptionError, match=r"crop=40 is larger than an image of 48x30 \(stored 48x30\)"):
        geometry.placement(48, 30)


def test_a_token_budget_read_has_one_geometry_with_one_per_cell(packed):
    # A token-budget batch is placed at its cell, which the order chooses per batch: the read's one
    # TokenGeometry gives each cell its geometry once, the one every batch of that cell is assembled by.
    path = packed("lmdb", **RAW)
    stream = open_iterable(path, buckets=TokenBudget(patch=8, budget=72, seq_lens=(16, 36)), seed=3)
    token = stream.assembler.token_geometry
    assert isinstance(token, TokenGeometry)
    seen: dict = {}
    for epoch in range(2):
        stream.set_epoch(epoch)
        for images, _ in stream:
            cell = stream.assembler.read_geometry
            assert cell.out == tuple(images.shape[2:])
            assert seen.setdefault(cell.out, cell) is cell
    assert len(seen) >= 2  # several cells, each with its one geometry
    assert sorted(map(id, token._cells.values())) == sorted(map(id, seen.values()))
