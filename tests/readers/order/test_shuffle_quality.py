"""Shuffle quality: the figures, the default pack + default read reaching i.i.d. class variety,
the warning on a class-sorted pack, and where the figures are shown (pack info, pack bench)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.engine.pack_run import pack_folder
from readers import open_iterable, shuffle_quality
from readers.formats.packed_sample import PreprocessSpec
from readers.order.epoch_order import pack_order
from readers.order.quality import _iid_distinct
from tests.conftest import run_cli

CLASSES, PER_CLASS = 40, 150
IMAGENET = np.repeat(np.arange(1000), 1281)  # class-sorted, like an old pack of ImageNet's train set


@pytest.fixture(scope="module")
def sorted_folder(tmp_path_factory) -> Path:
    """40 classes x 150 tiny images, each class a folder (so the source is class-sorted)."""
    root = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        folder = root / f"class{c:02d}"
        folder.mkdir()
        for i in range(PER_CLASS):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module")
def packs(sorted_folder, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("packs")
    paths = {}
    for order in ("shuffled", "source"):
        paths[order] = out / order
        pack_folder(sorted_folder, paths[order], "lmdb", PreprocessSpec(encode="png"), workers=2, order=order)
    return paths


def test_imagenet_shaped_figures_match_the_recorded_and_the_iid_expectation():
    before = shuffle_quality(IMAGENET, batch_size=256)
    assert 60 < before.mean_distinct < 66 and 225 < before.iid_mean_distinct < 227
    assert 9 < before.mean_largest_class < 11.5 and 2.7 < before.iid_mean_largest_class < 3.4
    after = shuffle_quality(IMAGENET[pack_order(len(IMAGENET), "shuffled", 0)], batch_size=256)
    assert after.distinct_ratio > 0.99 and abs(after.lag1_autocorrelation) < 0.01
    assert shuffle_quality(IMAGENET, batch_size=256, block_size=16).mean_distinct > 140
    sequential = shuffle_quality(IMAGENET, batch_size=256, shuffle=False)
    assert sequential.mean_distinct < 2 and sequential.lag1_autocorrelation > 0.99


def test_iid_distinct_classes_agree_with_a_simulation():
    labels = np.repeat(np.arange(30), np.arange(1, 31) * 7)  # unequal classes
    rng = np.random.default_rng(1)
    simulated = np.mean([len(set(rng.choice(labels, 50, replace=False).tolist())) for _ in range(4000)])
    assert _iid_distinct(np.bincount(labels), len(labels), 50) == pytest.approx(simulated, rel=0.01)


def batch_labels(path: Path, **options) -> list[np.ndarray]:
    return [labels.numpy() for _, labels in open_iterable(path, batch_size=64, **options)]


def test_default_pack_and_default_read_give_iid_class_variety_and_no_warning(packs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = batch_labels(packs["shuffled"])
    whole = [b for b in batches if len(b) == 64]
    distinct = np.mean([len(set(b.tolist())) for b in whole])
    iid = _iid_distinct(np.full(CLASSES, PER_CLASS), CLASSES * PER_CLASS, 64)
    assert distinct >= 0.95 * iid, (distinct, iid)
    predicted = shuffle_quality(np.concatenate(batches), batch_size=64)  # the figure tells the same
    assert predicted.distinct_ratio >= 0.95


def test_a_class_sorted_pack_warns_once_naming_the_fixes(packs):
    with pytest.warns(
        UserWarning, match=r"Re-pack with the default `--order shuffled`.*block_size.*buffer_size"
    ):
        open_iterable(packs["source"], batch_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_iterable(packs["source"], batch_size=64)  # once
        open_iterable(packs["source"], batch_size=64, shuffle=False)  # asked for sequential reads
    distinct = np.mean([len(set(b.tolist())) for b in batch_labels(packs["source"]) if len(b) == 64])
    assert distinct < 0.9 * _iid_distinct(np.full(CLASSES, PER_CLASS), CLASSES * PER_CLASS, 64)
    with pytest.warns(UserWarning, match="block_size=256"):
        open_iterable(packs["source"], batch_size=64, block_size=256)


def test_pack_info_shows_the_order_and_the_default_read_mix(packs):
    text = run_cli("info", packs["source"], check=True).stdout
    assert "order     source order (--order source)" in text
    assert "distinct classes per batch of 256:" in text and "lag-1 label autocorrelation" in text
    data = json.loads(run_cli("info", packs["shuffled"], "--json", check=True).stdout)
    assert data["extra"]["order"]["kind"] == "shuffled"
    assert data["read_quality"]["batch_size"] == 256 and data["read_quality"]["distinct_ratio"] > 0.95
    sorted_mix = json.loads(run_cli("info", packs["source"], "--json", check=True).stdout)["read_quality"]
    assert sorted_mix["distinct_ratio"] < 0.9


def test_pack_bench_prints_the_mix_beside_throughput(packs):
    text = run_cli("bench", packs["source"], "--workers", "0", "--epochs", "1", check=True).stdout
    header = next(line for line in text.splitlines() if "classes/batch (i.i.d.)" in line)
    row = text.splitlines()[text.splitlines().index(header) + 2].split()
    distinct, iid = float(row[-4]), float(row[-3].strip("()"))
    assert distinct < 0.9 * iid and iid == pytest.approx(
        _iid_distinct(np.full(CLASSES, PER_CLASS), 6000, 64), abs=0.1
    )


def test_a_mix_of_default_packs_keeps_iid_variety_and_a_mix_of_sorted_packs_warns(packs):
    from readers import mix

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mixed = mix([packs["shuffled"], packs["shuffled"]], batch_size=64, seed=2)
        batches = [labels.numpy() for _, labels in mixed]
    stream = np.concatenate(batches)
    assert sorted(np.bincount(stream).tolist()) == [PER_CLASS] * (2 * CLASSES)  # 80 classes, offset
    distinct = np.mean([len(set(b.tolist())) for b in batches if len(b) == 64])
    iid = _iid_distinct(np.full(2 * CLASSES, PER_CLASS), 2 * CLASSES * PER_CLASS, 64)
    assert distinct >= 0.95 * iid, (distinct, iid)
    with pytest.warns(UserWarning, match="Re-pack with the default `--order shuffled`"):
        mix([packs["source"], packs["source"]], batch_size=64, seed=2, block_size=256)
