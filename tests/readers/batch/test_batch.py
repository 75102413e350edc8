"""The batch fast path: whole batches assembled in shared memory inside DataLoader workers."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import make_loader, open_iterable
from readers.batch.batch_assembler import BatchAssembler, _resize
from readers.batch.shmring import MAX_SLOTS, STATS, mapped_rings
from readers.formats import open_reader
from readers.image.decode import decode_array
from tests.conftest import packed_items

N_SAMPLE = 44  # images in sample_data


def batches(path, workers=2, persistent=False, **kwargs):
    it = open_iterable(path, **kwargs)
    loader = DataLoader(
        it, batch_size=None, num_workers=workers, persistent_workers=persistent and workers > 0
    )
    return [(x.clone(), y.clone()) for x, y in loader]


def per_sample(path, **kwargs):
    """The per-sample path (no workers: the order does not depend on them) as HWC arrays."""
    it = open_iterable(path, decode="numpy", **kwargs)
    pairs = list(it)
    return np.stack([a for a, _ in pairs]), np.array([label for _, label in pairs])


def hwc(images: torch.Tensor, layout: str) -> np.ndarray:
    return (images.permute(0, 2, 3, 1) if layout == "CHW" else images).numpy()


@pytest.mark.parametrize("encode", ["png", "raw", "jpeg"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_batches_equal_per_sample_path(packed, encode, layout):
    path = packed("lmdb", resize=72, crop=64, encode=encode)
    ref_images, ref_labels = per_sample(path, shuffle=True, seed=3)
    got = batches(path, workers=2, batch_size=8, shuffle=True, seed=3, layout=layout)
    images = np.concatenate([hwc(x, layout) for x, _ in got])
    labels = np.concatenate([y.numpy() for _, y in got])
    assert [len(y) for _, y in got] == [8, 8, 8, 8, 8, 4]
    np.testing.assert_array_equal(labels, ref_labels)
    # Same decoder (simplejpeg, accurate IDCT) on both paths: identical pixels, JPEG included.
    np.testing.assert_array_equal(images, ref_images)


def test_fast_dct_close_to_accurate_decode(packed):
    path = packed("lmdb", resize=72, crop=64, encode="jpeg")
    exact = batches(path, workers=0, batch_size=16, shuffle=False)
    fast = batches(path, workers=0, batch_size=16, shuffle=False, fast_dct=True)
    a = torch.cat([x for x, _ in exact]).float()
    b = torch.cat([x for x, _ in fast]).float()
    diff = (a - b).abs()
    assert 0 < diff.mean() < 1.0 and diff.max() < 40


def test_shapes_dtypes_and_layouts(packed):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    (x, y), *_ = batches(path, workers=1, batch_size=5, layout="CHW")
    assert x.shape == (5, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert x.is_contiguous(memory_format=torch.channels_last)  # a permuted view of the HWC buffer
    assert x.contiguous().is_contiguous()
    (x, y), *_ = batches(path, workers=1, batch_size=5, layout="HWC")
    assert x.shape == (5, 32, 32, 3) and x.is_contiguous() and y.shape == (5,)
    gray = packed("lmdb", resize=40, crop=32, encode="png", mode="L")
    (x, _), *_ = batches(gray, workers=1, batch_size=5, layout="CHW")
    assert x.shape == (5, 1, 32, 32)


@pytest.mark.parametrize("workers", [0, 2])
def test_last_partial_batch_and_drop_last(packed, workers):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    sizes = [len(y) for _, y in batches(path, workers=workers, batch_size=10)]
    assert sizes == [10, 10, 10, 10, 4]
    it = open_iterable(path, batch_size=10, drop_last=True)
    got = batches(path, workers=workers, batch_size=10, drop_last=True)
    assert [len(y) for _, y in got] == [10] * 4 == [10] * len(it)


def test_grayscale_and_rgba_sources_packed_as_rgb(packed, sample_dir):
    path = packed("lmdb", resize=40, crop=32, encode="png")
    reader = open_reader(path)
    got = batches(path, workers=2, batch_size=11, shuffle=False)
    images = np.concatenate([hwc(x, "CHW") for x, _ in got])
    assert images.shape == (N_SAMPLE, 32, 32, 3)
    gray = [item.index for item in packed_items(path, sample_dir) if "gray" in item.rel]
    assert len(gray) >= 4 and len(gray) < N_SAMPLE
    for i in gray:  # grayscale sources come back as three equal channels
        assert (images[i, :, :, 0] == images[i, :, :, 1]).all() and (
            images[i, :, :, 1] == images[i, :, :, 2]
        ).all()
    colour = [i for i in range(N_SAMPLE) if i not in gray]
    assert any((images[i, :, :, 0] != images[i, :, :, 2]).any() for i in colour)
    for i in range(N_SAMPLE):
        np.testing.assert_array_equal(images[i], decode_array(reader.read(i)))


def reference(record, assembler: BatchAssembler) -> np.ndarray:
    geo = assembler.geometry(record.height, record.width)
    src = decode_array(record)
    if src.shape[:2] != geo.resized:
        src = _resize(src, geo.resized)
    return src[geo.top : geo.top + geo.out[0], geo.left : geo.left + geo.out[1]]


def test_read_time_resize_and_crop_of_varied_originals(packed):
    # Originals: CMYK, grayscale, palette and RGBA files of many sizes, resized and cropped at read time.
    path = packed("lmdb", encode="original")
    reader = open_reader(path)
    options = dict(resize=48, crop=(40, 44), layout="HWC")
    got = batches(path, workers=2, batch_size=7, shuffle=False, dct_scaling=False, **options)
    images = np.concatenate([x.numpy() for x, _ in got])
    assert images.shape == (N_SAMPLE, 40, 44, 3)
    assembler = BatchAssembler(**options, dct_scaling=False)
    for i in range(N_SAMPLE):
        np.testing.assert_array_equal(images[i], reference(reader.read(i), assembler))


def test_dct_scaling_close_to_full_decode(packed):
    path = packed("lmdb", resize=160, encode="jpeg")  # shorter side 160 >= 2 x 64: scaled decode
    full = batches(path, workers=0, batch_size=11, shuffle=False, resize=64, crop=56, dct_scaling=False)
    scaled = batches(path, workers=0, batch_size=11, shuffle=False, resize=64, crop=56)
    a = torch.cat([x for x, _ in full]).float()
    b = torch.cat([x for x, _ in scaled]).float()
    assert a.shape == b.shape == (N_SAMPLE, 3, 56, 56)
    diff = (a - b).abs()
    assert 0 < diff.mean() < 4.0, diff.mean()


def test_crop_larger_than_image_is_a_clear_error(packed):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    with pytest.raises(Exception, match="crop=48 is larger"):  # when it is created (issue 17)
        list(open_iterable(path, batch_size=4, crop=48))
    with pytest.raises(ValueError, match="batch_size"):
        open_iterable(path, decode_threads=2)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_order_independent_of_workers_and_epochs_differ(packed, workers):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    ref = batches(path, workers=0, batch_size=6, seed=5)
    got = batches(path, workers=workers, batch_size=6, seed=5)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got))
    it = open_iterable(path, batch_size=6, seed=5)
    it.set_epoch(1)
    other = torch.cat([y for _, y in DataLoader(it, batch_size=None, num_workers=workers)])
    assert sorted(other.tolist()) == sorted(torch.cat([y for _, y in ref]).tolist())
    assert not torch.equal(other, torch.cat([y for _, y in ref]))


def test_ranks_equal_and_resume(packed):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    counts = [sum(len(y) for _, y in batches(path, batch_size=5, rank=r, world_size=3)) for r in range(3)]
    assert counts == [15, 15, 15]
    full = batches(path, workers=2, batch_size=4, seed=1)
    it = open_iterable(path, batch_size=4, seed=1)
    it.load_state_dict(it.state_dict(consumed=12))
    rest = [(x, y) for x, y in DataLoader(it, batch_size=None, num_workers=2)]
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[3:], rest))


def test_batches_held_by_the_consumer_are_never_overwritten(packed):
    # Keep every batch alive: more than a worker's ring holds, so slots must not be reused.
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    ref_images, ref_labels = per_sample(path, shuffle=True, seed=9)
    it = open_iterable(path, batch_size=2, shuffle=True, seed=9)
    held = list(DataLoader(it, batch_size=None, num_workers=2))
    assert len(held) == N_SAMPLE // 2 > 2 * MAX_SLOTS
    np.testing.assert_array_equal(np.concatenate([hwc(x, "CHW") for x, _ in held]), ref_images)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in held]), ref_labels)


def shm_state() -> dict[str, int]:
    """Shared-memory mappings, open fds and resident memory (KiB) of this process."""
    with open("/proc/self/maps") as maps:
        state = {"mappings": sum(1 for line in maps if "/dev/shm" in line or "torch_" in line)}
    state["fds"] = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/status") as status:
        for line in status:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssShmem"):
                state[key] = int(line.split()[1])
    return state


@pytest.mark.parametrize("persistent", [False, True])
def test_shared_memory_released_over_epochs(packed, persistent):
    path = packed("lmdb", resize=72, crop=64, encode="raw")
    it = open_iterable(path, batch_size=8)
    loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=persistent)
    states = []
    checksum = None
    leases = STATS["leases"]
    for epoch in range(10):
        it.set_epoch(epoch)
        total = sum(int(x.sum()) for x, _ in loader)  # touches every pixel in the main process
        checksum = total if checksum is None else checksum
        assert total == checksum  # the same images every epoch, in another order
        gc.collect()
        states.append(shm_state())
    # After warm-up nothing grows: shared mappings, descriptors, shared memory resident in this
    # process (a leak of every batch would add ~0.5 MiB of RssShmem an epoch). /dev/shm and the
    # anonymous heap are not checked: other processes use the first, the DataLoader wobbles the second.
    warm = states[2]
    for later in states[3:]:
        assert later["mappings"] <= warm["mappings"] + 2, states  # +-1 wobble as workers come and go
        assert later["fds"] <= warm["fds"] + 2, states
        assert later["RssShmem"] <= warm["RssShmem"] + 128, states
    # Every batch came through a ring slot (none fell back to a one-off buffer), and slots are
    # reused: a worker needs its 2 prefetched batches plus the one being consumed.
    assert STATS["leases"] - leases == 10 * len(it)
    assert len(mapped_rings()) <= (2 if persistent else 4)
    assert max(mapped_rings()) <= 4, mapped_rings()


def test_decode_threads_give_the_same_batches(packed):
    path = packed("lmdb", resize=72, crop=64, encode="jpeg")
    plain = batches(path, workers=1, batch_size=9, seed=2)
    threaded = batches(path, workers=1, batch_size=9, seed=2, decode_threads=3)
    assert len(plain) == len(threaded) == 5
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, threaded))


def test_decode_threads_in_workers_after_a_batch_read_in_the_main_process(packed):
    path = packed("lmdb", resize=144, crop=128, encode="jpeg")

    def loader_after_a_look(**options):
        it = open_iterable(path, batch_size=30, seed=2, **options)
        next(iter(it))  # a look at a batch in the main process (the loader then reads epoch 1)
        return make_loader(it, num_workers=1, timeout=30)

    # jobs of 10 images: each of the 3 decode threads is started, then idle, in the main process
    got = [(x.clone(), y.clone()) for x, y in loader_after_a_look(decode_threads=3)]
    want = [(x.clone(), y.clone()) for x, y in loader_after_a_look()]
    assert len(got) == len(want) == 2  # before the fix: the forked worker's pool had no threads
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))


def test_raw_batches_copy_each_record_once_and_equal_the_stored_pixels(packed, monkeypatch):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    reader = open_reader(path)
    stored = np.stack([decode_array(reader.read(i)) for i in range(len(reader))])

    def general(*args):
        raise AssertionError("a raw record at the batch's size went through the per-record path")

    monkeypatch.setattr(BatchAssembler, "_put", general)
    for workers in (0, 2):
        got = batches(path, workers=workers, batch_size=10, shuffle=True, seed=3, layout="HWC")
        order = open_iterable(path, batch_size=10, shuffle=True, seed=3).order.epoch_order(0)
        np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in got]), stored[order])
    monkeypatch.undo()  # a flip needs the per-record path: still the stored pixels, mirrored where drawn
    flipped = batches(path, workers=0, batch_size=44, shuffle=False, flip=1.0, layout="HWC")[0][0].numpy()
    np.testing.assert_array_equal(flipped, stored[:, :, ::-1])
