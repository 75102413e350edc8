"""16-bit images are scaled by their bit depth, not by their maximum."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_cli

# -- 16-bit images are scaled by their bit depth, not by their maximum ------------------


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_16_bit_values_keep_their_high_byte_whatever_the_maximum(mode):
    from packer.transform.preprocess import preprocess_image
    from readers.formats.packed_sample import PreprocessSpec

    for value, expected in [(200, 0), (255, 0), (256, 1), (200 * 257, 200), (65535, 255)]:
        array = np.full((4, 4), value, np.uint16 if mode.startswith("I;16") else np.int32)
        img = Image.frombytes(mode, (4, 4), array.astype(">u2" if mode == "I;16B" else array.dtype).tobytes())
        out, _ = preprocess_image(img, b"", PreprocessSpec(encode="png"))
        assert np.asarray(out).max() == np.asarray(out).min() == expected, (mode, value)


def test_a_near_black_16_bit_png_packs_near_black(tmp_path):
    from readers import open_dataset

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(np.full((8, 8), 200, np.uint16)).save(src / "dark.png")  # 200/65535: near black
    Image.fromarray(np.full((8, 8), 51400, np.uint16)).save(src / "grey.png")  # 200/255 after scaling
    run_cli(
        "imagefolder",
        tmp_path / "src",
        "--to",
        "lmdb",
        "-o",
        tmp_path / "out",
        "--encode",
        "png",
        "-q",
        check=True,
    )
    ds = open_dataset(tmp_path / "out")
    assert sorted(int(np.asarray(ds[i][0]).max()) for i in range(len(ds))) == [0, 200]
