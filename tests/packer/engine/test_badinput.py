"""Every odd or broken input is packed correctly or recorded as skipped; the run always finishes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from readers import open_dataset, read_manifest, source_paths
from readers.errors import ImgpackError
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import run_cli
from tests.support.badinput import (
    EMPTY_CLASS,
    UNREADABLE,
    by_outcome,
    expected_image,
    make_bad_corpus,
    permissions_effective,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "src"
    root.mkdir()
    return root, make_bad_corpus(root)


@pytest.mark.parametrize("encode", ["png", "original"])
def test_every_input_is_packed_or_skipped(corpus, tmp_path, encode):
    root, expected = corpus
    out = tmp_path / "ds"
    report = pack_folder(root, out, "lmdb", PreprocessSpec(encode=encode), workers=2)
    manifest = read_manifest(out)
    outcomes = by_outcome(expected)
    skipped = {s["path"]: s["reason"] for s in manifest.skipped}
    assert set(skipped) == set(outcomes["skip"])
    assert all(reason for reason in skipped.values())
    assert manifest.num_samples == len(outcomes["ok"]) == report.packed
    assert EMPTY_CLASS in manifest.extra["empty_classes"]
    if encode == "png":
        ds = open_dataset(out, decode="numpy")
        classes = manifest.classes
        ok_in_order = source_paths(out)  # the pack's shuffled order
        assert sorted(ok_in_order) == sorted(outcomes["ok"])
        for i, rel in enumerate(ok_in_order):
            image, label = ds[i]
            assert classes[label] == rel.split("/")[0]
            reference = np.asarray(expected_image(root / rel))
            if rel.endswith(("rgba.png", "palette_transparency.png")):
                assert image.shape == reference.shape  # alpha flattened on white, not dropped
                continue
            np.testing.assert_array_equal(image, reference, err_msg=rel)


def test_reasons_name_the_problem(corpus, tmp_path):
    root, _ = corpus
    pack_folder(root, tmp_path / "ds", "lmdb", PreprocessSpec(encode="png"), workers=1)
    reasons = {s["path"]: s["reason"] for s in read_manifest(tmp_path / "ds").skipped}
    assert "empty" in reasons["broken/empty.jpg"]
    assert "decompression-bomb" in reasons["broken/bomb.png"]
    assert "not an image" in reasons["broken/text.jpg"]
    assert "truncated" in reasons["broken/truncated.jpg"] or "decode" in reasons["broken/truncated.jpg"]


def test_on_error_fail_names_the_first_bad_file(corpus, tmp_path):
    root, _ = corpus
    with pytest.raises(ImgpackError, match=r"broken/\w+\.\w+: .*--on-error fail"):
        pack_folder(root, tmp_path / "ds", "lmdb", PreprocessSpec(), workers=2, on_error="fail")
    assert not (tmp_path / "ds" / "manifest.json").exists()
    proc = run_cli("imagefolder", root, "--to", "lmdb", "-o", tmp_path / "cli", "--on-error", "fail", "-q")
    assert proc.returncode != 0
    assert "broken/" in proc.stderr and "Traceback" not in proc.stderr


def test_unreadable_file_is_skipped(corpus, tmp_path, monkeypatch):
    """Root ignores permission bits, so there the OS refusal is simulated at open()."""
    root, expected = corpus
    if not permissions_effective():
        import builtins

        import packer.transform.preprocess

        real_open = builtins.open

        def refusing_open(path, *args, **kwargs):
            if str(path).endswith(UNREADABLE):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(packer.transform.preprocess, "open", refusing_open, raising=False)
    pack_folder(root, tmp_path / "ds", "lmdb", PreprocessSpec(encode="png"), workers=1)
    reasons = {s["path"]: s["reason"] for s in read_manifest(tmp_path / "ds").skipped}
    assert "permission denied" in reasons[UNREADABLE]


def test_special_files_are_skipped_not_opened(tmp_path):
    """A FIFO named like an image would block open() forever; it must be skipped instead."""
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (8, 8), (1, 2, 3)).save(src / "good.png")
    os.mkfifo(src / "pipe.jpg")
    report = pack_folder(tmp_path / "src", tmp_path / "ds", "lmdb", PreprocessSpec(encode="png"), workers=1)
    assert report.packed == 1
    reasons = {s["path"]: s["reason"] for s in read_manifest(tmp_path / "ds").skipped}
    assert "not a regular file" in reasons["cls/pipe.jpg"]
