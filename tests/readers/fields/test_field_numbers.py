"""Issue 32 case 5: numbers keep their stored precision on every reading path.

float64 fields stay float64 (batches, per-sample, map-style, mix, the DALI fallback, ``floats``
lists too); CSV integers of 19 digits stay integers and wider ones text; an integer field beyond
int64 is refused at pack time, naming the line, where it used to pack and then fail every
batched read with OverflowError.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from packer.sources.imagelist import scan_list
from readers import dali_loader, make_loader, mix, open_dataset, open_iterable
from readers.formats.registry import formats_storing_fields
from tests.support.cocodata import draw_rectangles

VALUES = [1e-300, 1733090000.123456, 1733090001.5, -2.5e300]
N = len(VALUES)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return draw_rectangles(tmp_path_factory.mktemp("number-images"), N + 1)


def write_jsonl(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


@pytest.fixture(scope="module", params=formats_storing_fields())
def numbers(request, images, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(f"numbers-{request.param}")
    entries = [
        {"path": f"{i:02d}.png", "label": 0, "t": v, "many": [v, 0.1 + i]} for i, v in enumerate(VALUES)
    ]
    out = folder / "ds"
    pack_folder(scan_list(write_jsonl(folder / "l.jsonl", entries), images), out, request.param,
                workers=1, order="source")  # fmt: skip
    return out


def _exact(values) -> list[float]:
    array = np.asarray(values)
    assert array.dtype == np.float64, array.dtype
    return array.tolist()


def test_map_style_and_per_sample_reads_are_exact(numbers):
    ds = open_dataset(numbers, fields=["t", "many"])
    assert [ds[i][1]["t"] for i in range(N)] == VALUES
    assert [_exact(ds[i][1]["many"]) for i in range(N)] == [[v, 0.1 + i] for i, v in enumerate(VALUES)]
    per_sample = [t for _, t in open_iterable(numbers, shuffle=False, crop=32, fields=["t", "many"])]
    assert [t["t"] for t in per_sample] == VALUES
    assert [_exact(t["many"])[0] for t in per_sample] == VALUES


def test_batches_from_workers_keep_float64(numbers):
    loader = make_loader(
        open_iterable(numbers, shuffle=False, crop=32, batch_size=N, fields=["t", "many"]), num_workers=1
    )
    ((_, target),) = list(loader)
    assert _exact(target["t"].numpy()) == VALUES
    assert [_exact(m.numpy())[0] for m in target["many"]] == VALUES
    padded = next(
        iter(open_iterable(numbers, shuffle=False, crop=32, batch_size=N, fields=["many"], pad_fields=True))
    )
    assert _exact(padded[1]["many"].numpy()[:, 0]) == VALUES


def test_mix_and_the_dali_fallback_keep_float64(numbers):
    mixed = [
        t for _, b in mix([numbers, numbers], batch_size=N, crop=32, fields=["t"], seed=0) for t in b["t"]
    ]
    assert sorted(_exact(mixed)) == sorted(VALUES * 2)
    loader = dali_loader(numbers, batch_size=N, crop=32, device="dataloader", fields=["t"], num_workers=0)
    assert sorted(v for _, target in loader for v in _exact(target["t"].numpy())) == sorted(VALUES)


def test_csv_integers_of_19_digits_stay_integers_and_wider_ones_text(images, tmp_path):
    csv = tmp_path / "l.csv"
    big, wider = 1234567890123456789, "123456789012345678901"
    csv.write_text(f"path,label,id,code\n00.png,0,{big},{wider}\n01.png,0,-{big},{wider}9\n")
    scan = scan_list(csv, images)
    assert scan.fields == {"id": "int", "code": "str"}
    out = tmp_path / "ds"
    pack_folder(scan, out, "lmdb", workers=1, order="source")
    ds = open_dataset(out, fields=["id", "code"])
    assert [ds[0][1]["id"], ds[1][1]["id"]] == [big, -big]
    assert [ds[0][1]["code"], ds[1][1]["code"]] == [wider, wider + "9"]
    batch = next(iter(open_iterable(out, shuffle=False, crop=32, batch_size=2, fields=["id"])))[1]
    assert batch["id"].tolist() == [big, -big]


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, [1, 2**64]])
def test_an_integer_beyond_int64_is_refused_at_pack_time_with_its_line(images, tmp_path, value):
    entries = [
        {"path": f"{i:02d}.png", "label": 0, "n": ([i] if isinstance(value, list) else i)} for i in range(3)
    ]
    entries[1]["n"] = value
    scan = scan_list(write_jsonl(tmp_path / "l.jsonl", entries), images)
    assert len(scan) == 2
    (skip,) = scan.skipped
    assert skip["reason"].startswith("l.jsonl line 2: field 'n'") and "int64" in skip["reason"]
    out = tmp_path / "ds"
    pack_folder(scan, out, "lmdb", workers=1, order="source")
    assert (
        len(next(iter(open_iterable(out, shuffle=False, crop=32, batch_size=2, fields=["n"])))[1]["n"]) == 2
    )


def test_dali_carries_float_fields_as_float64():
    """The bytes ``dali_loader`` moves through its pipeline per sample (``readers.dali._fields``)."""
    from readers.dali._fields import from_bytes, to_bytes
    from readers.fields.field_schema import typed

    many = typed({"many": "floats"}, {"many": VALUES})["many"]
    assert _exact(from_bytes("floats", to_bytes("floats", many))) == VALUES
    assert [from_bytes("float", to_bytes("float", v)) for v in VALUES] == VALUES
