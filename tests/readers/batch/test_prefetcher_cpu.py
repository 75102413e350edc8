"""CudaPrefetcher on CPU: normalises a copy, accepts std alone, passes through without options."""

from __future__ import annotations

import torch

from readers import CudaPrefetcher


def test_prefetcher_on_cpu_normalises_a_copy_and_accepts_std_alone():
    images = torch.full((2, 3, 4, 4), 100.0)
    labels = torch.arange(2)
    original = images.clone()
    ((out, _),) = list(CudaPrefetcher([(images, labels)], device="cpu", mean=[50.0] * 3, std=[2.0] * 3))
    assert torch.equal(images, original)  # the loader's tensor is untouched
    assert out.dtype == torch.float32 and torch.all(out == 25.0)
    uint8 = torch.full((2, 3, 4, 4), 90, dtype=torch.uint8)
    ((out, _),) = list(CudaPrefetcher([(uint8, labels)], device="cpu", std=[3.0] * 3))
    assert out.dtype == torch.float32 and torch.all(out == 30.0)
    ((same, _),) = list(CudaPrefetcher([(uint8, labels)], device="cpu"))
    assert same is uint8  # no options: passed through unchanged
