"""The ``geometry`` record: one type on every path (per sample, whole batches, a DataLoader's
default collate, a mix) and the documented meaning: a stored point moves by its window, scale and
flip exactly as the returned boxes do."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main
from readers import RandomResizedCrop, make_loader, mix, open_dataset, open_iterable
from readers.fields.boxes import GeometryRecord
from tests.support.cocodata import coco_pack_args, make_coco

READ = {"crop": RandomResizedCrop(48, scale=(0.3, 1.0)), "flip": True, "seed": 1}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("geo")
    coco = make_coco(folder, count=16, empty=0)
    result = CliRunner().invoke(main, coco_pack_args(coco, "lmdb", folder / "d", "--workers", "1", "-q"))
    assert result.exit_code == 0, result.output
    return folder / "d"


def check_record(record) -> None:
    assert isinstance(record, GeometryRecord) and list(record) == ["stored", "window", "out", "flip"]
    assert type(record["stored"]) is tuple and all(type(v) is int for v in record["stored"])
    assert type(record["window"]) is tuple and all(type(v) is float for v in record["window"])
    assert type(record["out"]) is tuple and record["out"] == (48, 48) and type(record["flip"]) is bool


def test_one_type_on_every_path(packed):
    kw = {**READ, "fields": ["geometry"]}
    per_sample = [t["geometry"] for _, t in open_iterable(packed, **kw)]
    collated = [g for _, t in make_loader(open_iterable(packed, **kw), batch_size=4, num_workers=1)
                for g in t["geometry"]]  # fmt: skip
    batches = [g for _, t in make_loader(open_iterable(packed, batch_size=4, **kw), num_workers=1)
               for g in t["geometry"]]  # fmt: skip
    mixed = [g for _, t in mix([packed], batch_size=4, **kw) for g in t["geometry"]]
    assert len(per_sample) == len(collated) == len(batches) == len(mixed) == 16
    for record in [*per_sample, *collated, *batches, *mixed]:
        check_record(record)
    assert per_sample == collated == batches


def test_a_stored_point_moves_as_documented(packed):
    stored = open_dataset(packed, fields=["boxes"], decode="numpy")
    read = list(open_iterable(packed, shuffle=False, fields=["boxes", "geometry"], **READ))
    moved = 0
    for index, (_, target) in enumerate(read):
        g = target["geometry"]
        top, left, height, width = g["window"]
        (out_h, out_w), boxes = g["out"], stored[index][1]["boxes"]
        for x, y, w, h in boxes:
            x0, y0 = (x - left) * out_w / width, (y - top) * out_h / height
            x1, y1 = (x + w - left) * out_w / width, (y + h - top) * out_h / height
            if min(x0, y0) < 0 or x1 > out_w or y1 > out_h:
                continue  # clipped by the window: compared where the box lies wholly inside
            if g["flip"]:
                x0, x1 = out_w - x1, out_w - x0
            expected = np.array([x0, y0, x1 - x0, y1 - y0], np.float32)
            assert np.abs(target["boxes"] - expected).max(axis=1).min() < 1e-3
            moved += 1
    assert moved >= 3
