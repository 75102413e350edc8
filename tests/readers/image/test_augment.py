"""RandomResizedCrop + flip: torchvision's distribution, reproducible on every path, exact pixels.

Windows and flips are a function of (seed, epoch, global sample index) only, so the batch path,
the per-sample path, DALI on the CPU and the DataLoader fallback must all crop the same windows
of the same samples, for any worker count, rank split or resume point.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import RandomResizedCrop, open_iterable
from readers.dali import dali_loader
from readers.formats import open_reader
from readers.image.decode import decode_array
from readers.image.geometry import Augment, Window

N_DRAWS = 20_000
STORED = (256, 341)  # an ImageNet-like image packed at shorter side 256
RAW = {"resize": 48, "encode": "raw"}  # stored at several aspect ratios, shorter side 48
RRC = RandomResizedCrop(24)


def reference_window(height, width, scale, ratio, rng) -> Window:
    """torchvision's documented RandomResizedCrop.get_params, with an independent NumPy generator."""
    area = height * width
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return Window(int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return Window((height - h) // 2, (width - w) // 2, h, w)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def features(windows, height, width) -> tuple[np.ndarray, np.ndarray]:
    w = np.array(windows, dtype=np.float64)
    return w[:, 2] * w[:, 3] / (height * width), np.log(w[:, 3] / w[:, 2])


# Critical value at alpha = 0.001 for two samples of N_DRAWS each.
KS_CRITICAL = math.sqrt(-math.log(0.0005) / 2) * math.sqrt(2 / N_DRAWS)


@pytest.mark.parametrize(
    "stored,scale,ratio",
    [
        (STORED, (0.08, 1.0), (3 / 4, 4 / 3)),
        ((300, 120), (0.08, 1.0), (3 / 4, 4 / 3)),
        (STORED, (0.5, 0.9), (1.0, 2.0)),
    ],
)
def test_windows_follow_torchvision_distribution(stored, scale, ratio):
    spec = RandomResizedCrop(224, scale=scale, ratio=ratio)
    params = Augment(spec, 0.0, seed=7).params(0, np.arange(N_DRAWS), [stored] * N_DRAWS)
    ours = [w for w, _ in params]
    rng = np.random.default_rng(2024)
    ref = [reference_window(*stored, scale, ratio, rng) for _ in range(N_DRAWS)]
    h, w = stored
    assert all(0 <= t and 0 <= left and t + wh <= h and left + ww <= w for t, left, wh, ww in ours)
    for mine, theirs in zip(features(ours, h, w), features(ref, h, w)):
        assert ks_statistic(mine, theirs) < KS_CRITICAL
    # The test has power: a sampler with another scale range is rejected.
    other = [reference_window(*stored, (scale[0] + 0.1, scale[1]), ratio, rng) for _ in range(N_DRAWS)]
    assert ks_statistic(features(ours, h, w)[0], features(other, h, w)[0]) > KS_CRITICAL
    # Window positions are uniform too: the top offset over the free margin.
    tops = np.array([t / max(1, h - wh) for t, _, wh, _ in ours if h - wh >= 8])
    assert abs(tops.mean() - 0.5) < 0.02


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_flips_at_the_requested_rate(p):
    params = Augment(None, p, seed=1).params(5, np.arange(N_DRAWS), [STORED] * N_DRAWS)
    flips = sum(f for _, f in params)
    bound = 5 * math.sqrt(N_DRAWS * p * (1 - p))  # five standard deviations of the binomial
    assert abs(flips - N_DRAWS * p) <= bound
    assert all(w is None for w, _ in params)


def test_params_are_a_function_of_seed_epoch_and_index():
    aug = Augment(RandomResizedCrop(224), 0.5, seed=3)
    a = aug.params(2, [10, 11, 12], [STORED] * 3)
    assert aug.params(2, [12, 10], [STORED] * 2) == [a[2], a[0]]  # independent of batch company
    assert aug.params(3, [10, 11, 12], [STORED] * 3) != a
    assert Augment(RandomResizedCrop(224), 0.5, seed=4).params(2, [10, 11, 12], [STORED] * 3) != a


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"scale": (0.0, 1.0)}, "scale"),
        ({"scale": (0.5, 1.2)}, "scale"),
        ({"scale": (0.6, 0.5)}, "scale"),
        ({"scale": "big"}, "scale"),
        ({"ratio": (2.0, 1.0)}, "ratio"),
        ({"ratio": (0.0, 1.0)}, "ratio"),
        ({"size": 0}, "size"),
        ({"size": (224, -1)}, "size"),
    ],
)
def test_bad_spec_is_a_value_error_naming_the_argument(kwargs, name):
    args = {"size": 224, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}="):
        RandomResizedCrop(**args)


@pytest.mark.parametrize("flip", [1.5, -0.1, "yes"])
def test_bad_flip_is_a_value_error(packed, flip):
    path = packed("lmdb", **RAW)
    with pytest.raises(ValueError, match="^flip="):
        open_iterable(path, batch_size=4, crop=RRC, flip=flip)
    with pytest.raises(ValueError, match="^flip="):
        dali_loader(path, batch_size=4, crop=RRC, flip=flip, device="dataloader")
    with pytest.raises(ValueError, match="drop resize="):
        open_iterable(path, batch_size=4, crop=RRC, resize=32)


def loader_batches(it, workers=0, persistent=False):
    loader = DataLoader(
        it, batch_size=None, num_workers=workers, persistent_workers=persistent and workers > 0
    )
    return [(x.clone(), y.clone()) for x, y in loader]


def augmented(path, workers=0, epoch=1, **kwargs):
    options = {"batch_size": 4, "seed": 5, "crop": RRC, "flip": True, **kwargs}
    it = open_iterable(path, **options)
    it.set_epoch(epoch)
    return loader_batches(it, workers)


def cat(batches):
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def test_same_batches_for_any_worker_count_and_epochs_differ(packed):
    path = packed("lmdb", **RAW)
    ref = augmented(path, workers=0)
    assert ref[0][0].shape == (4, 3, 24, 24)
    for workers in (1, 3):
        got = augmented(path, workers=workers)
        assert len(got) == len(ref)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ref, got))
    other = cat(augmented(path, epoch=2))[0]
    assert not torch.equal(cat(ref)[0], other)
    # Epoch 2 sees the same samples (in its own order): the change is the augmentation, not only the order.
    unshuffled = [cat(augmented(path, epoch=e, shuffle=False))[0] for e in (1, 2)]
    assert not torch.equal(*unshuffled)


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_splits_union_to_the_single_rank_epoch(packed, world_size):
    path = packed("lmdb", **RAW)
    whole, labels = cat(augmented(path))
    parts = [cat(augmented(path, rank=r, world_size=world_size)) for r in range(world_size)]
    # 44 samples split evenly (no padding): the same augmented images, however the ranks share them.
    ranked = sorted((x.numpy().tobytes(), int(y)) for xs, ys in parts for x, y in zip(xs, ys))
    assert ranked == sorted((x.numpy().tobytes(), int(y)) for x, y in zip(whole, labels))
    assert len({image for image, _ in ranked}) == len(ranked)  # distinct crops: a real comparison


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_yields_the_same_augmented_samples(packed, persistent):
    path = packed("lmdb", **RAW)
    full = augmented(path, workers=2)
    k = 4
    it = open_iterable(path, batch_size=4, seed=5, crop=RRC, flip=True)
    it.set_epoch(1)
    loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=persistent)
    taken = []
    for batch in loader:
        taken.append(batch)
        if len(taken) == k:
            break
    state = it.state_dict(consumed=k * 4)
    resumed = open_iterable(path, batch_size=4, seed=5, crop=RRC, flip=True)
    resumed.load_state_dict(state)
    rest = loader_batches(resumed, workers=2, persistent=persistent)
    assert len(rest) == len(full) - k
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[k:], rest))


def expected_images(path, order, epoch, seed, spec, flip) -> np.ndarray:
    """OpenCV's resize of each decoded window, flipped: the area filter when the window is at least
    twice the output on both sides, bilinear otherwise (the documented rule)."""
    reader = open_reader(path)
    records = reader.read_many(order)
    params = Augment(spec, flip, seed).params(epoch, order, [(r.height, r.width) for r in records])
    out = []
    for record, (window, flipped) in zip(records, params):
        top, left, h, w = window
        crop = np.ascontiguousarray(decode_array(record)[top : top + h, left : left + w])
        oh, ow = spec.out
        interpolation = cv2.INTER_AREA if h >= 2 * oh and w >= 2 * ow else cv2.INTER_LINEAR
        image = cv2.resize(crop, (ow, oh), interpolation=interpolation)
        out.append(image[:, ::-1] if flipped else image)
    return np.stack(out)


@pytest.mark.parametrize("encode", ["raw", "png", "jpeg", "bmp"])
def test_output_equals_opencv_resize_of_the_decoded_window(packed, encode):
    fmt = "bmp" if encode == "bmp" else "lmdb"
    path = packed(fmt, resize=48, encode=encode)
    options = dict(seed=2, shuffle=False, crop=RRC, flip=0.5, dct_scaling=False)
    it = open_iterable(path, batch_size=8, layout="HWC", **options)
    it.set_epoch(3)
    got = cat(loader_batches(it))[0].numpy()
    want = expected_images(path, np.arange(len(got)), 3, 2, RRC, 0.5)
    # Tolerance: zero. The same decoder (simplejpeg, accurate IDCT, full size) and the same
    # OpenCV call on the same window.
    np.testing.assert_array_equal(got, want)
    # Per-sample path: the same crops, one image at a time.
    per_sample = open_iterable(path, decode="numpy", **options)
    per_sample.set_epoch(3)
    np.testing.assert_array_equal(np.stack([a for a, _ in per_sample]), got)


def test_dct_scaling_close_to_full_decode(packed):
    # Windows of a 256 px JPEG are often twice a 48 px output: decoded at 1/2 or 1/4 scale.
    path = packed("lmdb", resize=256, encode="jpeg", quality=90)
    spec = RandomResizedCrop(48, scale=(0.3, 1.0))
    options = dict(batch_size=11, seed=2, shuffle=False, crop=spec, layout="HWC")
    scaled = cat(loader_batches(open_iterable(path, **options)))[0].float()
    full = cat(loader_batches(open_iterable(path, dct_scaling=False, **options)))[0].float()
    want = expected_images(path, np.arange(len(full)), 0, 2, spec, 0.0)
    assert np.array_equal(full.numpy().astype(np.uint8), want)
    diff = (scaled - full).abs()
    # Stated tolerance for DCT scaling: a mean under 4.5 grey levels on these textured images (3.7
    # measured: about 1.3 from the scaled IDCT, the rest from the window's edges landing on the
    # coarser grid, within half a scaled pixel).
    assert 0 < diff.mean() < 4.5


@pytest.mark.parametrize("device", ["cpu", "dataloader"])
def test_dali_paths_crop_the_same_windows_and_flips(packed, device):
    path = packed("lmdb", **RAW)
    it = open_iterable(path, batch_size=8, seed=3, crop=RRC, flip=True)
    it.set_epoch(1)
    want, labels = cat(loader_batches(it))
    loader = dali_loader(path, batch_size=8, seed=3, crop=RRC, flip=True, device=device, num_workers=0)
    loader.set_epoch(1)
    got, got_labels = cat([(x.cpu(), y.cpu()) for x, y in loader])
    n = len(want)  # the DALI loader pads the last batch by wrapping; compare the epoch proper
    got, got_labels = got[:n], got_labels[:n]
    assert torch.equal(got_labels, labels)
    assert got.shape == want.shape and got.dtype == torch.uint8
    diff = (got.float() - want.float()).abs().mean(dim=(1, 2, 3))
    # Resampling differs (OpenCV's bilinear without antialiasing on shrinks under 2x against an
    # antialiased bilinear filter): measured 2.0-2.2 grey levels mean, 6.8 at most for one image.
    # A wrong window or a missed flip costs tens of levels on these images.
    assert diff.mean() < 3.0 and diff.max() < 8.0, diff
    mirrored = (got.flip(-1).float() - want.float()).abs().mean(dim=(1, 2, 3))
    assert (mirrored > diff).float().mean() > 0.9


# -- one geometry on every path (centre crops) ------------------------------------------------------
def test_rounding_rule_on_ties_and_odd_margins():
    from readers.image.geometry import centre_window, resized_size

    assert resized_size(100, 170, 25) == (25, 42)  # 42.5: ties to even
    assert resized_size(100, 150, 25) == (25, 38)  # 37.5: ties to even
    assert resized_size(171, 100, 25) == (43, 25)  # 42.75
    assert resized_size(5, 7, (3, 4)) == (3, 4)
    assert centre_window(47, 48, (38, 40)) == (4, 4, 38, 40)  # margins 9 and 8: the odd one rounds down
    assert centre_window(10, 11, (10, 8)) == (0, 1, 10, 8)


def test_centre_windows_agree_on_every_path():
    from readers.batch.batch_assembler import BatchAssembler
    from readers.dali._feed import BatchFeed
    from readers.order.epoch_order import OrderSpec
    from readers.store.record import Record

    stored = [(100, 170), (171, 100), (47, 48), (61, 80)]
    records = [Record(b"", 0, h, w, 3, "raw") for h, w in stored]
    feed = BatchFeed("unused", OrderSpec(4, False, 0, 64, 64, 0, 1, False), 4, resize=25, crop=(21, 23))
    plan = feed.plan(records, [0, 1, 2, 3], 0)
    assembler = BatchAssembler(resize=25, crop=(21, 23))
    for (h, w), size, window in zip(stored, plan.sizes.astype(int).tolist(), plan.windows.tolist()):
        geo = assembler.geometry(h, w)
        assert list(geo.resized) == size and [geo.top, geo.left, *geo.out] == window


def test_odd_margin_centre_crop_pixels_identical_on_every_path(packed):
    # Stored raw at several sizes (shorter side 48), cropped without a resize: no resampling at all,
    # so the batch path, DALI on the CPU and the fallback must give the very same pixels.
    path = packed("lmdb", **RAW)
    it = open_iterable(path, batch_size=8, seed=1, crop=(37, 41), flip=0.5, drop_last=True)
    want = cat(loader_batches(it))[0]
    for device in ("cpu", "dataloader"):
        options = dict(seed=1, crop=(37, 41), flip=0.5, device=device, drop_last=True)
        loader = dali_loader(path, batch_size=8, **options)
        got = cat([(x.cpu(), y.cpu()) for x, y in loader])[0]
        assert torch.equal(got, want), device
    # The packer crops with the same rule.
    from PIL import Image

    from packer.transform.preprocess import _centre_crop
    from readers.image.geometry import centre_window

    array = np.arange(47 * 48 * 3, dtype=np.uint8).reshape(47, 48, 3)
    top, left, h, w = centre_window(47, 48, (38, 38))
    cropped = np.asarray(_centre_crop(Image.fromarray(array), 38))
    np.testing.assert_array_equal(cropped, array[top : top + h, left : left + w])


def test_random_crops_of_original_files(packed):
    # Source bytes as stored (CMYK, grayscale, palette, EXIF-rotated...): every image one size.
    path = packed("lmdb", encode="original")
    options = dict(seed=4, shuffle=False, crop=RandomResizedCrop((20, 28)), flip=True)
    images, labels = cat(loader_batches(open_iterable(path, batch_size=16, **options)))
    assert images.shape == (44, 3, 20, 28) and images.dtype == torch.uint8
    per_sample = [(a, y) for a, y in open_iterable(path, **options)]
    assert torch.equal(torch.stack([a for a, _ in per_sample]), images)
    assert [y for _, y in per_sample] == labels.tolist()


@pytest.mark.parametrize("batch_path", [True, False])
def test_resume_through_make_loader_mid_epoch(packed, batch_path):
    # The StatefulDataLoader route (readers.make_loader), with workers, on both paths.
    from readers import make_loader

    path = packed("lmdb", **RAW)
    options = dict(seed=6, crop=RRC, flip=True, **({"batch_size": 4} if batch_path else {}))

    def loader(it):
        return make_loader(it, num_workers=2, **({} if batch_path else {"batch_size": 4}))

    full = [(x.clone(), y.clone()) for x, y in loader(open_iterable(path, **options))]
    first = loader(open_iterable(path, **options))
    taken = [batch for _, batch in zip(range(3), first)]
    state = first.state_dict()
    resumed = loader(open_iterable(path, **options))
    resumed.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(taken) + len(rest) == len(full)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[3:], rest))
