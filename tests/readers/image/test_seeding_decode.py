"""Seeding helpers, decoders and the prefetcher."""

from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from readers import CudaPrefetcher, make_generator, seed_everything, seed_worker
from readers.errors import ChecksumError
from readers.image.decode import decode_array, decode_record
from readers.store.record import Record, pack_record, unpack_record
from tests.conftest import SAMPLE_DATA


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_seed_everything_makes_every_rng_repeat():
    seed_everything(123)
    first = draws()
    seed_everything(123)
    assert draws() == first
    assert os.environ["PYTHONHASHSEED"] == "123"
    seed_everything(124)
    assert draws() != first


def test_seed_everything_deterministic_mode():
    try:
        seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(False)


class RandomDraws(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([random.random(), float(np.random.rand())])


def test_seed_worker_gives_workers_distinct_repeatable_streams():
    def run():
        loader = DataLoader(
            RandomDraws(),
            batch_size=None,
            num_workers=2,
            worker_init_fn=seed_worker,
            generator=make_generator(7),
        )
        return torch.stack(list(loader))

    a, b = run(), run()
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # worker 0 and worker 1 draw different numbers


def test_make_generator_is_seeded():
    assert torch.equal(torch.rand(3, generator=make_generator(5)), torch.rand(3, generator=make_generator(5)))


def jpeg_bytes(mode: str) -> bytes:
    buffer = io.BytesIO()
    Image.open(SAMPLE_DATA / "animals" / "chelsea.jpg").convert(mode).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def record(data: bytes, encoding: str, shape=(300, 451, 3)) -> Record:
    return Record(data, 1, shape[0], shape[1], shape[2], encoding)


def test_decoder_fallback_for_cmyk_jpeg():
    cmyk = record(jpeg_bytes("CMYK"), "jpeg")  # libjpeg-turbo's fast path refuses CMYK output as RGB
    rgb = record(jpeg_bytes("RGB"), "jpeg")
    a, b = decode_array(cmyk), decode_array(rgb)
    assert a.shape == b.shape == (300, 451, 3)
    assert np.abs(a.astype(int) - b.astype(int)).mean() < 8


def test_original_encoding_is_sniffed():
    buffer = io.BytesIO()
    Image.open(SAMPLE_DATA / "animals" / "chelsea.png").save(buffer, "PNG")
    expected = np.asarray(Image.open(SAMPLE_DATA / "animals" / "chelsea.png").convert("RGB"))
    np.testing.assert_array_equal(decode_array(record(buffer.getvalue(), "original")), expected)


def test_output_kinds():
    rec = record(np.arange(2 * 3 * 3, dtype=np.uint8).tobytes(), "raw", (2, 3, 3))
    array = decode_record(rec, "numpy")
    assert array.shape == (2, 3, 3) and array.dtype == np.uint8
    tensor = decode_record(rec, "tensor")
    assert tensor.shape == (3, 2, 3) and torch.equal(tensor, torch.from_numpy(array.copy()).permute(2, 0, 1))
    assert decode_record(rec, "pil").size == (3, 2)
    assert decode_record(rec, "bytes") == bytes(rec.data)
    with pytest.raises(ValueError, match="unknown decode kind"):
        decode_record(rec, "jpeg")


def test_record_header_round_trip_and_checksum():
    value = pack_record(b"pixels", 7, 2, 1, 3, "raw")
    rec = unpack_record(value, verify=True)
    assert (bytes(rec.data), rec.label, rec.height, rec.width, rec.channels, rec.encoding) == (
        b"pixels",
        7,
        2,
        1,
        3,
        "raw",
    )
    corrupt = bytearray(value)
    corrupt[-1] ^= 1
    with pytest.raises(ChecksumError):
        unpack_record(bytes(corrupt), verify=True)


def test_prefetcher_is_a_pass_through_on_cpu_with_normalisation():
    batches = [(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), torch.tensor([0, 1])) for _ in range(3)]
    plain = list(CudaPrefetcher(batches, device="cpu"))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, batches))
    normalised = list(
        CudaPrefetcher(batches, device="cpu", mean=[127.5] * 3, std=[127.5] * 3, channels_last=True)
    )
    images = normalised[0][0]
    assert images.dtype == torch.float32 and torch.allclose(images, torch.ones_like(images))
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert len(CudaPrefetcher(batches)) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only path: needs CUDA")
def test_prefetcher_copies_on_a_side_stream():
    batches = [(torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8).pin_memory(), torch.tensor([0, 1]))]
    out = list(CudaPrefetcher(batches, mean=[0, 0, 0], std=[1, 1, 1]))
    assert out[0][0].is_cuda and torch.equal(out[0][0].cpu(), batches[0][0].float())
