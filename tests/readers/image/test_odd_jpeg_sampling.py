"""A JPEG whose sampling (4:4:1) simplejpeg's header parser cannot name packs as an original and reads
on every format."""

from __future__ import annotations

import shutil

import numpy as np

from readers import open_dataset
from readers.formats import format_names
from tests.conftest import SAMPLE_DATA, run_cli


# -- a JPEG whose sampling simplejpeg's header parser cannot name ------------------------
def _jpeg_441() -> bytes:
    """A flat grey 16x32 baseline JPEG sampled 4:4:1 (luma 1x4), which no common encoder writes:
    OpenCV's 4:4:0 file with the luma factor set to 1x4 and scan data for all-zero blocks (with the
    standard Huffman tables: luma DC 0 = 00, luma EOB = 1010, chroma DC 0 = 00, chroma EOB = 00)."""
    import cv2

    grey = np.full((32, 16, 3), 128, np.uint8)
    ok, buf = cv2.imencode(".jpg", grey, [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, 0x121111])  # 4:4:0
    data = buf.tobytes()
    sof, sos = data.find(b"\xff\xc0"), data.find(b"\xff\xda")
    head = bytearray(data[:sos])
    head[sof + 11] = 0x14  # component 1 (Y): h=1, v=4
    scan_header = data[sos : sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")]
    mcu = bytes([0x28, 0xA2, 0x8A, 0x00])  # 4 luma blocks then Cb and Cr, all zero
    return bytes(head) + scan_header + mcu * 2 + b"\xff\xd9"


def test_a_441_jpeg_packed_original_reads_on_every_format(tmp_path):
    from PIL import Image

    from readers import open_iterable

    source = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA / "animals", source / "animals")
    (source / "animals" / "zz441.jpg").write_bytes(_jpeg_441())
    with Image.open(source / "animals" / "zz441.jpg") as img:
        assert img.layer[0][1:3] == (1, 4)  # the sampling the probe found
    for fmt in format_names():
        out = tmp_path / fmt
        run_cli("imagefolder", source, "--to", fmt, "-o", out, "--encode", "original", "--order", "source",
                "--workers", "1", "-q", check=True)  # fmt: skip
        ds = open_dataset(out, decode="numpy")
        image = ds[len(ds) - 1][0]
        assert image.shape == (32, 16, 3) and (np.abs(image.astype(int) - 128) <= 1).all(), fmt
        batches = open_iterable(out, shuffle=False, batch_size=len(ds), crop=16, resize=16)
        assert next(iter(batches))[0].shape[0] == len(ds), fmt
