"""buckets= on DALI's own pipeline (CPU here, device_id=None): open_iterable's bucketed batches.

The same samples in the same batches and shapes as ``open_iterable`` with the same buckets, seed
and epoch, on every rank; pixels within the resamplers' difference (DALI's antialiased
``fn.resize`` against readers.image.resample, as in test_dali.py); boxes that frame the drawn
rectangles; exact mid-epoch resume, from a state that says where open_iterable's says.

The set: one class folder per image (a label names its sample), smooth gradients with a few
blocks (so a one-pixel shift of the window shows, and noise does not swamp the resamplers),
at 16:9, 9:16, 4:3, 3:4 and 1:1.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from readers import AspectBuckets, ResumeError, make_loader, open_iterable
from readers.dali import dali_loader
from tests.readers.bucketing import test_buckets
from tests.readers.dali.test_dali import assert_same, batches
from tests.readers.dali.test_dali_fields import assert_same_targets
from tests.readers.fields.test_boxes_read import FIELDS, check_frames

SHAPES = {(72, 128): 11, (128, 72): 9, (96, 128): 7, (128, 96): 6, (112, 112): 7}  # (h, w): images
BUCKETS = AspectBuckets(area=48 * 48, multiple=8)
OFFSET = AspectBuckets(area=48 * 48, multiple=8, random_offset=True)
CARRY = AspectBuckets(area=48 * 48, multiple=8, random_offset=True, leftover="carry")  # lengths vary by epoch
BATCH = 4
# Mean absolute pixel difference allowed per batch. Stored pixels: DALI's antialiased linear
# fn.resize against readers.image.resample on a ~2.3x shrink, measured 0.4-0.6 here, and 1.7-2.2 with
# every window one stored pixel off. JPEG: tests/readers/dali/test_dali.py's 3.0 (measured 1.3-2.6: the CPU
# path also decodes at 1/2 scale, DCT scaling, where DALI decodes whole).
MAD = {"raw": 1.0, "jpeg": 3.0}


@pytest.fixture(scope="module")
def aspects(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("aspects-src")
    rng = np.random.default_rng(1)
    sizes = [s for s, n in SHAPES.items() for _ in range(n)]
    for index, (h, w) in enumerate(sizes):
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([255 * x / w, 255 * y / h, 128 + 0 * x], axis=-1)
        for _ in range(3):
            top, left = int(rng.integers(0, h - 16)), int(rng.integers(0, w - 16))
            pixels[top : top + 16, left : left + 16] = rng.integers(0, 256, 3)
        folder = src / f"c{index:03d}"
        folder.mkdir()
        Image.fromarray(pixels.astype(np.uint8)).save(folder / "img.png")
    return src


def pack(src: Path, out: Path, encode: str) -> Path:
    args = ["imagefolder", str(src), "--to", "lmdb", "-o", str(out), "--encode", encode, "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def packs(aspects, tmp_path_factory) -> dict[str, Path]:
    return {e: pack(aspects, tmp_path_factory.mktemp(f"aspects-{e}") / "ds", e) for e in ("jpeg", "raw")}


def reference(path: Path, epoch: int, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    it = open_iterable(path, **options)
    it.set_epoch(epoch)
    return batches(make_loader(it, num_workers=0))


@pytest.mark.parametrize(
    "encode, buckets, world, py_workers",
    [("jpeg", BUCKETS, 1, 0), ("jpeg", OFFSET, 2, 2), ("raw", OFFSET, 1, 0), ("raw", BUCKETS, 2, 0),
     ("raw", CARRY, 2, 0)],  # fmt: skip
    ids=["jpeg-centre", "jpeg-offset-2ranks-pyworkers", "raw-offset", "raw-centre-2ranks", "raw-carry-2"],
)
def test_dali_pipeline_reads_open_iterables_bucketed_batches(packs, encode, buckets, world, py_workers):
    path = packs[encode]
    steps = []
    for rank in range(world):
        options = dict(batch_size=BATCH, buckets=buckets, seed=7, flip=True, rank=rank, world_size=world)
        loader = dali_loader(path, device="cpu", py_workers=py_workers, **options)
        assert loader.backend == "dali-cpu"
        loader.set_epoch(1)
        got = batches(loader)
        want = reference(path, 1, **options)
        assert len(got) == len(loader) == len(want)
        assert_same(got, want, mad=MAD[encode])  # the same labels (= samples), shapes; close pixels
        steps.append([tuple(images.shape[2:]) for images, _ in got])
    assert len(set(steps[0])) >= 3  # several buckets: the output shape changes between batches
    assert all(ranks == steps[0] for ranks in steps)  # one bucket at each step on every rank


def test_the_window_is_the_cover_window_not_a_centre_crop(packs):
    """Against the same read with windows shifted by a random offset: the pixels tell them apart."""
    path = packs["raw"]
    options = dict(batch_size=BATCH, seed=7)
    centre = batches(dali_loader(path, device="cpu", buckets=BUCKETS, **options))
    offset = batches(dali_loader(path, device="cpu", buckets=OFFSET, **options))
    assert [y.tolist() for _, y in centre] == [y.tolist() for _, y in offset]
    differences = [(a.float() - b.float()).abs().mean().item() for (a, _), (b, _) in zip(centre, offset)]
    assert max(differences) > MAD["jpeg"], differences


coco_lmdb = test_buckets.coco_lmdb  # the COCO set of tests/readers/bucketing/test_buckets.py, 80 images


def plain(target: dict) -> dict:
    """``"geometry"`` as lists (the DataLoader's collation makes its tuples lists; DALI's stay tuples)."""
    return {**target, "geometry": json.loads(json.dumps(target["geometry"]))}


@pytest.mark.parametrize("random_offset", [False, True])
def test_boxes_frame_the_drawn_rectangles_after_bucketing_in_dali(coco_lmdb, random_offset):
    buckets = AspectBuckets(area=64 * 64, multiple=16, random_offset=random_offset)
    options = dict(batch_size=8, buckets=buckets, flip=True, seed=2, fields=[*FIELDS, "geometry"])
    loader = dali_loader(coco_lmdb, device="cpu", **options)
    got = [(images.clone(), plain(target)) for images, target in loader]
    want = [(images, plain(target)) for images, target in make_loader(open_iterable(coco_lmdb, **options))]
    # equal targets (moved by the batch path's code through the same windows and flips), close pixels
    assert assert_same_targets(got, want, mad=MAD["jpeg"]) >= 80
    compared = 0
    for images, target in got:
        for i in range(len(images)):
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
    assert len({tuple(images.shape[2:]) for images, _ in got}) >= 3 and compared >= 80


@pytest.mark.parametrize("buckets", [OFFSET, CARRY], ids=["pad", "carry"])
def test_resume_mid_epoch_is_exact_and_says_what_open_iterable_says(packs, buckets):
    path = packs["jpeg"]
    options = dict(batch_size=BATCH, buckets=buckets, seed=7, flip=True)
    loader = dali_loader(path, device="cpu", **options)
    loader.set_epoch(1)
    full = [labels.tolist() for _, labels in loader]
    full_next = [labels.tolist() for _, labels in loader]  # the next pass: epoch 2
    loader.set_epoch(1)
    taken = [labels.tolist() for _, labels in itertools.islice(loader, 3)]
    state = loader.state_dict()
    it = open_iterable(path, **options)
    it.set_epoch(1)
    assert [labels.tolist() for _, labels in itertools.islice(it, 3)] == taken
    theirs = it.state_dict()
    for key in ("epoch", "position", "offset", "num_samples", "buckets"):
        assert state[key] == theirs[key], key
    del loader  # "killed": a fresh loader goes on from the saved state
    resumed = dali_loader(path, device="cpu", **options)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full) - 3
    assert taken + [labels.tolist() for _, labels in resumed] == full
    assert [labels.tolist() for _, labels in resumed] == full_next  # and the next epoch, whole
    with pytest.raises(ResumeError, match="buckets"):
        dali_loader(path, device="cpu", **{**options, "buckets": BUCKETS}).load_state_dict(state)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("encode", ["jpeg", "raw"])
def test_gpu_pipeline_reads_the_cpu_pipelines_bucketed_batches(packs, encode):
    options = dict(batch_size=BATCH, buckets=OFFSET, seed=7, flip=True)
    gpu = batches(dali_loader(packs[encode], device="gpu", **options))
    cpu = batches(dali_loader(packs[encode], device="cpu", **options))
    assert_same(gpu, cpu, mad=2.5 if encode == "jpeg" else 0.5)  # nvJPEG's rounding: test_dali_gpu.py
