"""readers.dali on a CUDA GPU (``device="gpu"``: nvJPEG through DALI's ``mixed`` decoder).

Each test compares the GPU pipeline with DALI's CPU pipeline on the same arguments: the same
samples in the same order with the same windows and flips, pixels equal within decoder tolerance.
These run only where a GPU exists (marked ``gpu``); everything around them runs on the CPU in
tests/readers/dali/test_dali.py and tests/readers/image/test_augment.py.
"""

from __future__ import annotations

import pytest
import torch

from readers import RandomResizedCrop
from readers.dali import dali_loader
from tests.readers.dali.test_dali import CASES, MEAN, RAW, STD, assert_same, batches, identities, sample_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def both(path, **kwargs):
    gpu = dali_loader(path, device="gpu", **kwargs)
    cpu = dali_loader(path, device="cpu", **kwargs)
    assert gpu.backend == "dali-gpu" and cpu.backend == "dali-cpu"
    return batches(gpu), batches(cpu)  # batches() copies to the CPU


@pytest.mark.parametrize("fmt,spec", CASES, ids=[f"{f}-{s['encode']}" for f, s in CASES])
def test_gpu_matches_cpu_on_every_format(packed, fmt, spec):
    path = packed(fmt, **spec)
    gpu, cpu = both(path, batch_size=8, seed=3, resize=47, crop=(38, 40))
    assert gpu[0][0].shape == (8, 3, 38, 40) and gpu[0][0].dtype == torch.uint8
    # nvJPEG rounds its IDCT and chroma upsampling differently from libjpeg-turbo; the other
    # encodings decode to the same pixels and differ only in the resize's float rounding.
    assert_same(gpu, cpu, mad=2.0 if spec["encode"] == "jpeg" else 0.5)


def test_gpu_outputs_live_on_the_gpu(packed):
    path = packed("lmdb", **CASES[0][1])
    loader = dali_loader(path, batch_size=8, device="gpu", crop=56, mean=MEAN, std=STD, layout="HWC")
    images, labels = next(iter(loader))
    assert images.is_cuda and labels.is_cuda
    assert images.shape == (8, 56, 56, 3) and images.dtype == torch.float32


@pytest.mark.parametrize("encode", ["jpeg", "raw"])
def test_gpu_random_resized_crop_and_flip_match_cpu(packed, encode):
    path = packed("lmdb", resize=64, encode=encode)
    crop = RandomResizedCrop(40, scale=(0.2, 1.0))
    kwargs = dict(batch_size=8, seed=5, crop=crop, flip=True)
    gpu_loader = dali_loader(path, device="gpu", **kwargs)
    cpu_loader = dali_loader(path, device="cpu", **kwargs)
    gpu_loader.set_epoch(3)
    cpu_loader.set_epoch(3)
    gpu, cpu = batches(gpu_loader), batches(cpu_loader)
    assert_same(gpu, cpu, mad=2.5 if encode == "jpeg" else 0.5)
    # A window or flip that differed would cost tens of grey levels on these photographs.
    x_gpu, x_cpu = torch.cat([x for x, _ in gpu]).float(), torch.cat([x for x, _ in cpu]).float()
    per_image = (x_gpu - x_cpu).abs().mean(dim=(1, 2, 3))
    assert per_image.max() < 8.0, per_image


def test_gpu_grayscale(packed):
    path = packed("lmdb", resize=40, crop=40, encode="jpeg", mode="L")
    gpu, cpu = both(path, batch_size=8, resize=(24, 32))
    assert gpu[0][0].shape == (8, 1, 24, 32)
    assert_same(gpu, cpu, mad=2.0)


def test_gpu_ranks_are_disjoint_and_order_matches_cpu(packed):
    path = packed("lmdb", **RAW)
    ids = identities(path)
    kwargs = dict(world_size=2, pad_last=False, seed=4)
    gpu = [sample_ids(dali_loader(path, batch_size=5, device="gpu", rank=r, **kwargs), ids) for r in range(2)]
    cpu = [sample_ids(dali_loader(path, batch_size=5, device="cpu", rank=r, **kwargs), ids) for r in range(2)]
    assert gpu == cpu
    assert not set(gpu[0]) & set(gpu[1]) and len(set(gpu[0]) | set(gpu[1])) == 44


def test_gpu_parallel_external_source_matches_serial(packed):
    path = packed("lmdb", **CASES[0][1])
    serial = batches(dali_loader(path, batch_size=8, device="gpu", crop=48))
    parallel = batches(dali_loader(path, batch_size=8, device="gpu", crop=48, py_workers=2))
    assert_same(serial, parallel, mad=0.0)
