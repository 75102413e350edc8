"""Windows decoded from the restart marker above them (csrc/restart_rows.c): the whole decode's
pixels, the rows above never read, and damaged or unusual JPEGs left to the normal path.

JPEGs are made with OpenCV (every chroma sampling it writes, restart intervals of one MCU row,
two rows and three MCUs) and with Pillow; the reference is the same library's whole decode at the
same DCT scale, cropped. imgpack's packer writes no restart markers (see readers/jpegwindow.py);
JPEGs that have them reach the readers as originals (``--encode original``).
"""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

import readers.batch
from readers import RandomResizedCrop, jpegwindow, open_iterable
from readers.formats import open_reader
from readers.loader import make_loader
from tests.helpers_jpeg import textured_pixels

pytestmark = pytest.mark.skipif(jpegwindow.DECODER is None, reason="test_jpegwindow.py fails for this")

# OpenCV's sampling flag -> the MCU's (width, height) in pixels
SAMPLING = {
    "411": (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411, (32, 8)),
    "420": (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, (16, 16)),
    "422": (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422, (16, 8)),
    "440": (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440, (8, 16)),
    "444": (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, (8, 8)),
}
SIZES = [(257, 383), (33, 17), (100, 101), (70, 48)]


def cv_jpeg(image: np.ndarray, sampling: int, interval: int) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling]
    ok, data = cv2.imencode(".jpg", image, params + [cv2.IMWRITE_JPEG_RST_INTERVAL, interval])
    assert ok
    return data.tobytes()


def marked_jpeg(image: np.ndarray) -> bytes:
    """A 4:2:0 (or grey) JPEG with a restart marker at the start of every MCU row (OpenCV counts
    the interval in MCUs: 16 px wide in colour, 8 px blocks in grey)."""
    grey = image.ndim == 2
    per_row = -(-image.shape[1] // (8 if grey else 16))
    return cv_jpeg(image, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, per_row)


def decode(data: bytes, shape, channels: int, top: int, left: int, height: int, width: int, eighths: int,
           fast_dct: bool = False, from_marker: bool = True):  # fmt: skip
    """(pixels, skipped_rows), or None where the decoder refuses."""
    out = np.empty(height * shape[1] * channels, np.uint8)
    result = jpegwindow.DECODER.decode(
        data, out, top, left, height, width, eighths, channels == 1, fast_dct, from_marker
    )
    if result is None:
        return None
    row_width, skip = result[:2]
    return out[: height * row_width * channels].reshape(height, row_width, channels)[
        :, skip : skip + width
    ], result[4]


def scaled_shape(size, eighths: int) -> tuple[int, int]:
    return -(-size[0] * eighths // 8), -(-size[1] * eighths // 8)


def check_every_top(data: bytes, size, channels: int, mcu_height: int, per_row: bool, rng) -> int:
    """Windows from every row (every few rows of large images) at five DCT scales: pixels equal
    to the whole decode's; with a marker at every MCU row, decoding starts one row above the
    window's MCU row. Returns how many windows started at a marker."""
    jumped = 0
    for eighths in (8, 4, 3, 2, 1):
        shape = scaled_shape(size, eighths)
        fast_dct = bool(rng.integers(2))
        whole, skipped = decode(data, shape, channels, 0, 0, *shape, eighths, fast_dct)
        assert skipped == 0
        for top in range(0, shape[0], max(1, shape[0] // 50)):
            height = int(rng.integers(1, shape[0] - top + 1))
            width = int(rng.integers(1, shape[1] + 1))
            left = int(rng.integers(0, shape[1] - width + 1))
            got = decode(data, shape, channels, top, left, height, width, eighths, fast_dct)
            assert got is not None, (size, eighths, top)
            pixels, skipped = got
            where = f"{size} 1/{8 / eighths:g} scale, window {top},{left} {height}x{width}"
            np.testing.assert_array_equal(pixels, whole[top : top + height, left : left + width], where)
            first_row = top * 8 // eighths
            if per_row:
                assert skipped == max(0, first_row // mcu_height - 1) * mcu_height, where
            assert skipped % mcu_height == 0 and skipped <= max(0, first_row - mcu_height), where
            jumped += skipped > 0
    return jumped


@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_windows_from_a_restart_marker_equal_the_whole_decode(sampling):
    flag, (mcu_width, mcu_height) = SAMPLING[sampling]
    rng = np.random.default_rng(int(sampling))
    jumped = 0
    for size in SIZES:
        per_row = -(-size[1] // mcu_width)
        for interval in (per_row, 2 * per_row, 3):
            data = cv_jpeg(textured_pixels(*size), flag, interval)
            jumped += check_every_top(data, size, 3, mcu_height, interval == per_row, rng)
    assert jumped > 100


def test_grey_jpegs_from_the_packer_and_from_pillow():
    rng = np.random.default_rng(1)
    for size in SIZES:
        grey = textured_pixels(*size)[..., 1].copy()
        buffer = io.BytesIO()
        Image.fromarray(grey).save(buffer, "JPEG", quality=90, restart_marker_rows=1)
        for data in (marked_jpeg(grey), buffer.getvalue()):
            assert Image.open(io.BytesIO(data)).mode == "L"
            assert check_every_top(data, size, 1, 8, True, rng) > 0
        # Colour JPEGs, decoded to colour and to grey.
        colour = marked_jpeg(textured_pixels(*size))
        for channels in (3, 1):
            assert check_every_top(colour, size, channels, 16, True, rng) > 0


def test_jpegs_without_usable_markers_skip_rows_as_before():
    image = textured_pixels(200, 160)
    no_markers = cv_jpeg(image, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, 0)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=90, progressive=True, restart_marker_rows=1)
    for data in (no_markers, buffer.getvalue()):
        whole, _ = decode(data, (200, 160), 3, 0, 0, 200, 160, 8)
        for top in range(0, 200, 7):
            pixels, skipped = decode(data, (200, 160), 3, top, 0, 200 - top, 160, 8)
            assert skipped == 0
            np.testing.assert_array_equal(pixels, whole[top:])
    # from_restart_marker=False never starts at a marker, and gives the same pixels.
    marked = marked_jpeg(image)
    jumped, _ = decode(marked, (200, 160), 3, 120, 0, 80, 160, 8)
    skipped_rows, skipped = decode(marked, (200, 160), 3, 120, 0, 80, 160, 8, from_marker=False)
    assert skipped == 0
    np.testing.assert_array_equal(jumped, skipped_rows)


def restart_offsets(data: bytes) -> list[int]:
    scan = data.index(b"\xff\xda")
    return [i for i in range(scan, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


def test_damaged_markers_above_the_window_are_refused_not_decoded_wrong():
    data = marked_jpeg(textured_pixels(256, 256))
    offsets = restart_offsets(data)
    assert len(offsets) == 256 // 16 - 1
    window = (200, 0, 56, 256)
    renumbered = bytearray(data)
    renumbered[offsets[3] + 1] = 0xD0 + (renumbered[offsets[3] + 1] - 0xD0 + 2) % 8
    missing = data[: offsets[2]] + data[offsets[2] + 2 :]
    for damaged in (bytes(renumbered), missing):
        # The normal path meets the damage while skipping the rows above: a libjpeg warning.
        assert decode(damaged, (256, 256), 3, *window, 8) is None
    # Damage below the window is never reached, by either path.
    below = bytearray(data)
    below[offsets[-1] + 1] = 0xD0 + (below[offsets[-1] + 1] - 0xD0 + 3) % 8
    whole, _ = decode(data, (256, 256), 3, 0, 0, 256, 256, 8)
    pixels, skipped = decode(bytes(below), (256, 256), 3, 16, 0, 32, 256, 8)
    assert skipped == 0
    np.testing.assert_array_equal(pixels, whole[16:48])


def test_random_damage_never_crashes_and_both_paths_agree_where_both_decode():
    rng = np.random.default_rng(3)
    data = marked_jpeg(textured_pixels(96, 80))
    scan = data.index(b"\xff\xda")
    agreed = 0
    for case in range(400):
        damaged = bytearray(data)
        if case % 4 == 0:
            damaged = damaged[: int(rng.integers(2, len(data)))]
        else:  # a few bytes anywhere, header included
            for _ in range(int(rng.integers(1, 4))):
                position = int(rng.integers(2, len(damaged)) if case % 4 == 1 else rng.integers(2, scan + 20))
                damaged[position] = int(rng.integers(256))
        top = int(rng.integers(0, 96))
        height = int(rng.integers(1, 96 - top + 1))
        window = (top, 0, height, 80)
        results = [decode(bytes(damaged), (96, 80), 3, *window, 8, False, jump) for jump in (True, False)]
        if results[0] is not None and results[1] is not None:
            np.testing.assert_array_equal(results[0][0], results[1][0])
            agreed += 1
    assert agreed > 50


def test_originals_with_restart_rows_are_packed_unchanged_and_start_at_a_marker(packed, tmp_path):
    source = tmp_path / "src" / "a"
    source.mkdir(parents=True)
    files = {}  # by height, which differs per image
    for i in range(4):
        files[300 + 17 * i] = marked_jpeg(textured_pixels(300 + 17 * i, 260, seed=i))
        (source / f"{i}.jpg").write_bytes(files[300 + 17 * i])
    path = packed("lmdb", src=tmp_path / "src", encode="original")
    reader = open_reader(path)
    for record in reader.read_many(np.arange(4)):
        data = bytes(record.data)
        assert data == files[record.height]
        assert len(restart_offsets(data)) == -(-record.height // 16) - 1
        shape = (record.height, record.width)
        window = (record.height - 40, 0, 40, record.width)
        pixels, skipped = decode(data, shape, 3, *window, 8)
        assert skipped >= record.height - 40 - 32
        whole, _ = decode(data, shape, 3, 0, 0, *shape, 8)
        np.testing.assert_array_equal(pixels, whole[-40:])


class CountingDecoder:
    """jpegwindow.DECODER, counting the windows decoded from a restart marker."""

    def __init__(self, real):
        self.real, self.from_marker = real, 0

    def decode(self, *args):
        result = self.real.decode(*args)
        self.from_marker += result is not None and result[4] > 0
        return result


def test_training_batches_from_restart_markers_equal_whole_decodes(packed, tmp_path, monkeypatch):
    source = tmp_path / "src"
    for i in range(12):
        folder = source / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.jpg").write_bytes(marked_jpeg(textured_pixels(180 + 11 * i, 150 + 7 * i, seed=i)))
    path = packed("lmdb", src=source, encode="original")

    def epoch(workers: int = 0) -> torch.Tensor:
        crop = RandomResizedCrop(48)
        it = open_iterable(path, batch_size=4, layout="HWC", seed=5, crop=crop, flip=True)
        it.set_epoch(3)
        loader = make_loader(it, num_workers=workers) if workers else it
        return torch.cat([x.clone() for x, _ in loader])

    counting = CountingDecoder(jpegwindow.DECODER)
    monkeypatch.setattr(jpegwindow, "DECODER", counting)
    from_markers = epoch()
    assert counting.from_marker >= 3
    monkeypatch.setattr(readers.batch, "decode_window", lambda *args, **kwargs: None)
    np.testing.assert_array_equal(from_markers.numpy(), epoch().numpy())
    monkeypatch.undo()
    # Real DataLoader workers decode from the markers the same way.
    np.testing.assert_array_equal(epoch(workers=2).numpy(), from_markers.numpy())
    per_sample = open_iterable(path, decode="numpy", seed=5, crop=RandomResizedCrop(48), flip=True)
    per_sample.set_epoch(3)
    np.testing.assert_array_equal(np.stack([a for a, _ in per_sample]), from_markers.numpy())
