"""The format contract (tests/support/format_contract/) for every registered format, and the registry's
own promises: an unknown name is one clear error, a format stores only the encodings it declares."""

from __future__ import annotations

import dataclasses

import pytest

from packer.engine.pack_run import pack_folder
from readers.errors import ImgpackError
from readers.formats import format_named, format_names, register_format, unregister_format
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA
from tests.support import npyformat
from tests.support.format_contract import FormatContract


class TestEveryRegisteredFormat(FormatContract):
    @pytest.fixture(params=format_names())
    def fmt(self, request) -> str:
        return request.param


def test_an_unknown_format_is_one_clear_error(tmp_path):
    known = ", ".join(format_names())
    with pytest.raises(ImgpackError, match=f"unknown format 'nope'; choose one of {known}"):
        pack_folder(SAMPLE_DATA, tmp_path / "x", "nope")


def test_a_format_stores_only_the_encodings_it_declares(tmp_path):
    lossless = dataclasses.replace(npyformat.FORMAT, encodings=("png", "raw"))
    register_format(lossless, replace=True)
    try:
        with pytest.raises(ImgpackError, match="--to npy does not store --encode jpeg; use one of png, raw"):
            pack_folder(SAMPLE_DATA, tmp_path / "a", "npy", PreprocessSpec(encode="jpeg"), workers=1)
        assert not (tmp_path / "a").exists()  # refused before anything was written
    finally:
        unregister_format("npy")
    pinned = [f for f in format_names() if len(format_named(f).encodings) == 1]
    for fmt in pinned:  # a format storing one encoding takes it whatever --encode says
        pack_folder(SAMPLE_DATA, tmp_path / fmt, fmt, PreprocessSpec(resize=16, encode="jpeg"), workers=1)
        assert read_manifest(tmp_path / fmt).encoding == format_named(fmt).encodings[0]
    assert pinned  # bmp
