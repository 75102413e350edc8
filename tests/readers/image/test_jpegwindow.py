"""Decode only the crop window of a JPEG (readers.image.jpegwindow): the same pixels as a whole decode.

The JPEGs are made here with Pillow: odd sizes, 4:2:0 / 4:2:2 / 4:4:4, grey, progressive, restart
markers, CMYK. Windows touch every edge, and are small, thin or whole. The reference is a whole
decode by the same library (no cropping, no skipped rows) followed by the crop, and today's path
(simplejpeg decodes the whole image, then the crop).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader

import readers.batch.batch_slot
from readers import RandomResizedCrop, open_iterable
from readers.image import jpegwindow
from readers.image.decode import decode_array
from readers.image.geometry import Window, scaled_window
from readers.store.record import Record
from tests.support.formats import formats_storing
from tests.support.jpeg import textured_pixels
from tests.support.jpeg_corpus import first_scans, markers

SIZES = [(257, 383), (33, 17), (100, 101), (512, 300)]
KINDS = {
    "420": {},
    "422": {"subsampling": 1},
    "444": {"subsampling": 0},
    "progressive": {"progressive": True},
    "restart-blocks": {"restart_marker_blocks": 3},
    "restart-rows-progressive": {"restart_marker_rows": 1, "progressive": True},
}


def textured(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    return Image.fromarray(textured_pixels(height, width, seed)).convert(mode)


def jpeg_bytes(image: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


def windows(height: int, width: int, rng: np.random.Generator, count: int = 24) -> list[Window]:
    """Windows on every edge and corner, one pixel wide or tall, the whole image, and random ones."""
    h, w = max(1, height // 3), max(1, width // 3)
    fixed = [
        Window(0, 0, height, width),
        Window(0, 0, h, w),
        Window(height - h, width - w, h, w),
        Window(0, width - w, h, w),
        Window(height - h, 0, h, w),
        Window(0, 0, height, 1),
        Window(0, width - 1, height, 1),
        Window(height - 1, 0, 1, width),
        Window(height // 2, width // 2, 1, 1),
    ]
    for _ in range(count):
        wh, ww = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        fixed.append(
            Window(int(rng.integers(0, height - wh + 1)), int(rng.integers(0, width - ww + 1)), wh, ww)
        )
    return fixed


def whole_then_crop(data: bytes, stored, window: Window, out, channels: int, fast_dct: bool):
    """The reference: the same library decodes the whole image at the same DCT scale, then crop."""
    height, width = stored
    eighths = 8
    if window.height >= 2 * out[0] and window.width >= 2 * out[1]:
        need = (-(-height * out[0] // window.height), -(-width * out[1] // window.width))
        eighths = jpegwindow.dct_eighths(height, width, *need)
    shape = (-(-height * eighths // 8), -(-width * eighths // 8))
    buf = np.empty(shape[0] * shape[1] * channels, np.uint8)
    result = jpegwindow.DECODER.decode(data, buf, 0, 0, *shape, eighths, channels == 1, fast_dct)
    assert result is not None and result[0] == shape[1] and result[1] == 0
    whole = buf.reshape(*shape, channels)
    if eighths != 8:
        window = scaled_window(window, (shape[0] / height, shape[1] / width), shape)
    top, left, h, w = window
    return whole[top : top + h, left : left + w], eighths


def test_the_extension_is_built_and_finds_a_libjpeg_turbo():
    # CI tests the real extension: `pip install -e .` builds it, Pillow's wheel brings the library.
    from readers import _jpegwindow  # noqa: F401 - the import is the check

    assert jpegwindow.DECODER is not None


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_window_pixels_equal_a_whole_decode_then_crop(kind, mode):
    rng = np.random.default_rng(len(kind) + len(mode))
    channels = 1 if mode == "L" else 3
    scaled = 0
    for stored in SIZES:
        data = jpeg_bytes(textured(*stored, mode), **KINDS[kind])
        for window in windows(*stored, rng):
            # Outputs from the window's own size (no DCT scaling) down to an eighth (1/8 scale).
            divisor = int(rng.choice([1, 2, 3, 5, 8]))
            out = (max(1, window.height // divisor), max(1, window.width // divisor))
            fast_dct = bool(rng.integers(2))
            scratch = np.empty(stored[0] * stored[1] * channels, np.uint8)
            got = jpegwindow.decode_window(data, stored, window, out, channels, scratch, fast_dct)
            want, eighths = whole_then_crop(data, stored, window, out, channels, fast_dct)
            scaled += eighths != 8
            assert got is not None, (stored, window)
            # Tolerance: zero. libjpeg-turbo decodes the context rows and columns that fancy
            # upsampling needs; the decoder adds one column each side of the crop for that.
            np.testing.assert_array_equal(got, want, err_msg=f"{kind} {mode} {stored} {window} {out}")
            # Today's path: simplejpeg (its own libjpeg-turbo build) decodes whole, then the crop.
            kwargs: dict = {"colorspace": "GRAY" if channels == 1 else "RGB", "fastdct": fast_dct}
            if eighths != 8:
                need = (-(-stored[0] * out[0] // window.height), -(-stored[1] * out[1] // window.width))
                kwargs.update(min_height=need[0], min_width=need[1], min_factor=2)
            full = simplejpeg.decode_jpeg(data, **kwargs)
            assert full.shape[:2] == (-(-stored[0] * eighths // 8), -(-stored[1] * eighths // 8))
            mapped = scaled_window(
                window, (full.shape[0] / stored[0], full.shape[1] / stored[1]), full.shape[:2]
            )
            ref = full[mapped.top : mapped.top + mapped.height, mapped.left : mapped.left + mapped.width]
            # Measured: 0 on every window here (both libraries are libjpeg-turbo 3.x with the same
            # SIMD IDCT); a different build may round the IDCT differently by one grey level.
            assert np.abs(got.astype(int) - ref.reshape(got.shape).astype(int)).max() <= 1
    assert scaled > 20  # DCT scaling combined with the window was exercised


def test_cmyk_truncated_and_mismatched_jpegs_are_refused():
    rng = np.random.default_rng(0)
    scratch = np.empty(100 * 120 * 3, np.uint8)
    window, out = Window(10, 20, 50, 60), (50, 60)
    cmyk = jpeg_bytes(textured(100, 120, "CMYK"))
    assert jpegwindow.decode_window(cmyk, (100, 120), window, out, 3, scratch) is None
    good = jpeg_bytes(textured(100, 120))
    assert jpegwindow.decode_window(good[: len(good) // 2], (100, 120), window, out, 3, scratch) is None
    assert (
        jpegwindow.decode_window(b"\xff\xd8\xff" + rng.bytes(500), (100, 120), window, out, 3, scratch)
        is None
    )
    # A record whose stored size disagrees with the JPEG header: the general path decides.
    assert jpegwindow.decode_window(good, (120, 100), Window(0, 0, 10, 10), (10, 10), 3, scratch) is None
    assert jpegwindow.decode_window(good, (100, 120), window, out, 3, scratch) is not None


def make_jpeg_folder(root: Path) -> Path:
    """Two classes of JPEGs of every kind: odd sizes, grey, CMYK, progressive, restart markers."""
    specs = [
        ("RGB", (257, 383), {}),
        ("RGB", (140, 97), {"progressive": True}),
        ("RGB", (96, 129), {"restart_marker_blocks": 2}),
        ("RGB", (181, 150), {"subsampling": 1, "restart_marker_rows": 1}),
        ("L", (120, 133), {}),
        ("CMYK", (99, 101), {}),
    ]
    for i in range(12):
        mode, size, options = specs[i % len(specs)]
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:02d}.jpg").write_bytes(jpeg_bytes(textured(*size, mode, seed=i), **options))
    return root


def batches(path: Path, workers: int = 0, **options) -> torch.Tensor:
    it = open_iterable(path, batch_size=5, layout="HWC", shuffle=False, seed=3, **options)
    it.set_epoch(2)
    loader = DataLoader(it, batch_size=None, num_workers=workers)
    return torch.cat([x.clone() for x, _ in loader])


def counting_decoder(calls: dict):
    """``jpegwindow.decode_window``, counting in ``calls["decoded"]`` the windows it decoded."""
    real = jpegwindow.decode_window

    def counting(*args, **kwargs):
        region = real(*args, **kwargs)
        calls["decoded"] += region is not None
        return region

    return counting


@pytest.mark.parametrize("encode", ["jpeg", "original"])
def test_training_batches_decode_only_the_window_with_identical_pixels(packed, tmp_path, monkeypatch, encode):
    source = make_jpeg_folder(tmp_path / "src")
    path = packed("lmdb", src=source, encode=encode, quality=90)
    calls = {"decoded": 0}
    counting = counting_decoder(calls)
    spec = RandomResizedCrop(40, scale=(0.08, 1.0))
    for options in (
        {"crop": spec, "flip": True},
        {"crop": spec, "flip": True, "fast_dct": True},
        {"crop": 64},
    ):
        monkeypatch.setattr(readers.batch.batch_slot, "decode_window", counting)
        windowed = batches(path, **options)
        assert calls["decoded"] >= 10  # every JPEG but the CMYK ones (refused: decoded whole)
        calls["decoded"] = 0
        monkeypatch.setattr(readers.batch.batch_slot, "decode_window", lambda *args, **kwargs: None)
        whole = batches(path, **options)
        np.testing.assert_array_equal(windowed.numpy(), whole.numpy())
        monkeypatch.undo()
        # Real DataLoader workers and the per-sample path crop the same windows the same way.
        np.testing.assert_array_equal(batches(path, workers=2, **options).numpy(), windowed.numpy())
        per_sample = open_iterable(path, decode="numpy", shuffle=False, seed=3, **options)
        per_sample.set_epoch(2)
        np.testing.assert_array_equal(np.stack([a for a, _ in per_sample]), windowed.numpy())


def test_centre_crop_of_a_stored_jpeg_is_the_crop_of_the_whole_decode(packed, tmp_path):
    source = make_jpeg_folder(tmp_path / "src")
    path = packed("lmdb", src=source, encode="jpeg", resize=90, quality=90)
    got = batches(path, crop=(64, 80)).numpy()
    from readers.formats import open_reader

    reader = open_reader(path)
    records: list[Record] = reader.read_many(np.arange(len(got)))
    for image, record in zip(got, records):
        whole = decode_array(record)
        top, left = (whole.shape[0] - 64) // 2, (whole.shape[1] - 80) // 2
        np.testing.assert_array_equal(image, whole[top : top + 64, left : left + 80])


@pytest.mark.parametrize("workers", [0, 2])
def test_dali_dataloader_fallback_decodes_only_the_window(packed, tmp_path, monkeypatch, workers):
    from readers.dali import dali_loader

    source = make_jpeg_folder(tmp_path / "src")
    path = packed("lmdb", src=source, encode="jpeg", quality=90)
    options = dict(seed=3, crop=RandomResizedCrop(40), flip=True, device="dataloader", num_workers=workers)

    def epoch() -> torch.Tensor:
        loader = dali_loader(path, batch_size=5, **options)
        loader.set_epoch(1)
        return torch.cat([x.clone() for x, _ in loader])

    calls = {"decoded": 0}
    monkeypatch.setattr(readers.batch.batch_slot, "decode_window", counting_decoder(calls))
    windowed = epoch()
    if workers == 0:  # counted in this process
        assert calls["decoded"] >= 10
    monkeypatch.setattr(readers.batch.batch_slot, "decode_window", lambda *args, **kwargs: None)
    np.testing.assert_array_equal(windowed.numpy(), epoch().numpy())


def test_without_the_window_decoder_the_reads_are_unchanged(packed, tmp_path):
    # IMGPACK_JPEG_WINDOW=0 (as without the extension): whole decodes, the same batches.
    source = make_jpeg_folder(tmp_path / "src")
    path = packed("lmdb", src=source, encode="jpeg", quality=90)
    script = (
        "import sys, numpy as np; from readers import RandomResizedCrop, open_iterable\n"
        "from readers.image import jpegwindow\n"
        "print(jpegwindow.DECODER is None)\n"
        "it = open_iterable(sys.argv[1], batch_size=5, layout='HWC', shuffle=False, seed=3,\n"
        "                   crop=RandomResizedCrop(40), flip=True)\n"
        "it.set_epoch(2)\n"
        "np.save(sys.argv[2], np.concatenate([x.numpy() for x, _ in it]))\n"
    )
    got = {}
    for flag in ("0", "1"):
        out = tmp_path / f"batches-{flag}.npy"
        env = {**os.environ, "IMGPACK_JPEG_WINDOW": flag}
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), str(out)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(flag == "0")]
        got[flag] = np.load(out)
    np.testing.assert_array_equal(got["0"], got["1"])


def test_a_library_that_decodes_differently_is_not_used():
    # The load-time check: the real decoder passes; one that refuses or gives other pixels fails.
    assert jpegwindow._decodes_like_simplejpeg(jpegwindow.DECODER)

    class Refusing:
        def decode(self, *args):
            return None

    class OffByOne:
        def decode(self, data, out, *args):
            result = jpegwindow.DECODER.decode(data, out, *args)
            out += 1
            return result

    assert not jpegwindow._decodes_like_simplejpeg(Refusing())
    assert not jpegwindow._decodes_like_simplejpeg(OffByOne())


def progressive_cut_after_each_scan(height: int, width: int, mode: str) -> list[bytes]:
    """A progressive JPEG ended (with EOI) after 1, 2, ... of its scans: libjpeg decodes each
    without a warning and estimates the missing coefficients from neighbouring blocks."""
    whole = jpeg_bytes(textured(height, width, mode, seed=width), progressive=True)
    return [first_scans(whole, k) for k in range(1, len(markers(whole, 0xDA)))]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_progressive_jpegs_ending_after_some_scans_give_the_whole_decodes_window(mode):
    # Issue 31 case 3: cropped rows had no left neighbour for block smoothing, so the window's
    # left edge differed from the whole decode (up to 53 grey levels; 75% of random windows).
    rng = np.random.default_rng(31)
    channels = 1 if mode == "L" else 3
    checked = 0
    for stored in [(100, 131), (190, 257)]:
        for data in progressive_cut_after_each_scan(*stored, mode):
            with Image.open(io.BytesIO(data)) as image:
                full = np.asarray(image).reshape(*stored, channels)  # Pillow: the whole decode
            for window in windows(*stored, rng, count=12):
                scratch = np.empty(stored[0] * stored[1] * channels, np.uint8)
                got = jpegwindow.decode_window(data, stored, window, window[2:], channels, scratch)
                assert got is not None, (stored, window)
                top, left, h, w = window
                np.testing.assert_array_equal(got, full[top : top + h, left : left + w], err_msg=str(window))
                # DCT-scaled windows too, against the same library's whole decode at that scale.
                out = (max(1, h // 4), max(1, w // 4))
                got = jpegwindow.decode_window(data, stored, window, out, channels, scratch)
                want, _ = whole_then_crop(data, stored, window, out, channels, False)
                np.testing.assert_array_equal(got, want, err_msg=f"{window} {out}")
                checked += 1
    assert checked > 200


@pytest.mark.parametrize("fmt", formats_storing("original"))
def test_original_packs_of_cut_progressive_jpegs_read_alike_on_every_path(packed, tmp_path, monkeypatch, fmt):
    # Case 3 in the readers: `--encode original` keeps such files as they are, and every read
    # path (batches, DataLoader workers, per-sample, DALI's DataLoader fallback) must give the
    # whole decode's crop.
    from readers.dali import dali_loader

    root = tmp_path / "src"
    for i, data in enumerate(progressive_cut_after_each_scan(120, 161, "RGB")):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:02d}.jpg").write_bytes(data)
    path = packed(fmt, src=root, encode="original")
    options = {"crop": RandomResizedCrop(48, scale=(0.08, 1.0)), "flip": True}
    calls = {"decoded": 0}
    monkeypatch.setattr(readers.batch.batch_slot, "decode_window", counting_decoder(calls))
    windowed = batches(path, **options)
    assert calls["decoded"] >= 8
    dali = dali_loader(path, batch_size=5, seed=3, device="dataloader", num_workers=0, **options)
    dali.set_epoch(1)
    dali_windowed = torch.cat([x.clone() for x, _ in dali])
    monkeypatch.setattr(readers.batch.batch_slot, "decode_window", lambda *args, **kwargs: None)
    whole = batches(path, **options)
    dali.set_epoch(1)
    np.testing.assert_array_equal(dali_windowed.numpy(), torch.cat([x.clone() for x, _ in dali]).numpy())
    monkeypatch.undo()
    np.testing.assert_array_equal(windowed.numpy(), whole.numpy())
    np.testing.assert_array_equal(batches(path, workers=2, **options).numpy(), whole.numpy())
    per_sample = open_iterable(path, decode="numpy", shuffle=False, seed=3, **options)
    per_sample.set_epoch(2)
    np.testing.assert_array_equal(np.stack([a for a, _ in per_sample]), whole.numpy())


@pytest.mark.parametrize("argument", ["top", "left", "height", "width"])
@pytest.mark.parametrize("value", [2**32 - 1, 2**33, -1, 2**64, 65501])
def test_the_c_api_refuses_window_arguments_outside_the_jpeg_limit(argument, value):
    # Issue 31 case 10: unsigned arguments wrapped (left = 2**32 - 1 with width 16 "decoded",
    # left = 2**33 was taken as 0).
    data = jpeg_bytes(textured(64, 64))
    out = np.empty(64 * 64 * 3, np.uint8)
    args = {"top": 0, "left": 0, "height": 16, "width": 16}
    assert jpegwindow.DECODER.decode(data, out, *args.values(), 8, False, False) is not None
    args[argument] = value
    with pytest.raises(ValueError, match="0..65500"):
        jpegwindow.DECODER.decode(data, out, *args.values(), 8, False, False)


@pytest.mark.parametrize("eighths", [0, 17, -1, 2**32 + 8])
def test_the_c_api_refuses_scales_outside_one_to_sixteen_eighths(eighths):
    data = jpeg_bytes(textured(64, 64))
    out = np.empty(64 * 64 * 3, np.uint8)
    with pytest.raises(ValueError, match="eighths"):
        jpegwindow.DECODER.decode(data, out, 0, 0, 16, 16, eighths, False, False)


def test_a_window_beyond_the_jpeg_limit_goes_to_the_general_decoders():
    # A record claiming a size no JPEG can have: decode_window refuses (None), it does not raise.
    data = jpeg_bytes(textured(64, 64))
    scratch = np.empty(16 * 70000 * 3, np.uint8)
    window = Window(0, 65490, 16, 20)
    assert jpegwindow.decode_window(data, (64, 70000), window, (16, 20), 3, scratch) is None


def test_a_small_jpeg_declaring_a_huge_progressive_image_is_refused_in_bounded_memory(tmp_path):
    # Found by the fuzzer: 723 bytes declaring a 65089 x 65278 progressive image made libjpeg
    # allocate its whole coefficient buffer (8 GB of RSS) for a 274-row window. Here 30000 x
    # 30000 grey (1.8 GB of coefficients), decoded in a child whose peak RSS is measured.
    data = bytearray(jpeg_bytes(textured(48, 64, "L"), progressive=True))
    sof = markers(bytes(data), 0xC2)[0]
    data[sof + 5 : sof + 9] = (30000).to_bytes(2, "big") * 2
    (tmp_path / "bomb.jpg").write_bytes(data)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forking process (pytest,
    # hundreds of MB late in a full run); VmHWM is the child's own address space's peak.
    script = (
        "import sys, numpy as np; from readers.image import jpegwindow\n"
        "data = open(sys.argv[1], 'rb').read(); out = np.empty(16 * 30000, np.uint8)\n"
        "print(jpegwindow.DECODER.decode(data, out, 0, 0, 16, 16, 8, True, False))\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "print(int(hwm.split()[1]) // 1024)\n"
    )
    command = [sys.executable, "-c", script, str(tmp_path / "bomb.jpg")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result, peak_mb = done.stdout.split()
    assert result == "None"  # refused: the general decoders (and their size checks) take it
    assert int(peak_mb) < 600, f"{peak_mb} MB"
