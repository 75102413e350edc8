"""One geometry, one resampler: resizing at pack time equals resizing at read time."""

from __future__ import annotations

import numpy as np

from readers import open_iterable


# -- one geometry, one resampler for pack time and read time ------------------------------------
def test_pack_resize_equals_read_resize_of_a_lossless_original(tmp_path):
    from PIL import Image

    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec
    from tests.conftest import SAMPLE_DATA

    source = tmp_path / "png-source"
    for path in sorted(SAMPLE_DATA.rglob("*.jpg"))[:12]:
        out = source / path.parent.name / (path.stem + ".png")
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.open(path).convert("RGB").save(out)
    full, small = tmp_path / "full", tmp_path / "small"
    pack_folder(source, full, "lmdb", PreprocessSpec(encode="png"), workers=1, options={})
    pack_folder(source, small, "lmdb", PreprocessSpec(resize=37, encode="raw"), workers=1, options={})
    read = list(open_iterable(full, shuffle=False, resize=37, decode="numpy"))
    packed = list(open_iterable(small, shuffle=False, decode="numpy"))
    assert len(read) == len(packed) == 12
    for (a, ya), (b, yb) in zip(read, packed):
        assert ya == yb and a.shape == b.shape and min(a.shape[:2]) == 37
        assert np.array_equal(a, b)
