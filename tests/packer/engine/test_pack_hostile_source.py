"""Hostile source trees: names that are not UTF-8, very long names that collide, symlink loops and
links into other classes, unreadable folders. Every format packs them or records why not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from packer.engine.pack_run import pack_folder
from packer.info.verify import verify_dataset
from readers import open_dataset, read_manifest
from readers.formats import format_names
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA
from tests.support.packrun import run_pack

SMALL = PreprocessSpec(resize=24)


def _image(path: bytes | Path, shade: int) -> None:
    Image.new("RGB", (40, 30), (shade, 90, 0)).save(os.fsdecode(path), format="JPEG")


def non_utf8_tree(root: Path) -> Path:
    """Two classes, one named with a byte that is not UTF-8, and a broken file so named too."""
    base = os.fsencode(root)
    for cls in (b"cat", b"d\xffog"):
        os.makedirs(base + b"/" + cls)
        for i in range(3):
            _image(base + b"/" + cls + b"/im%d.jpg" % i, 40 * i)
    with open(base + b"/cat/bad\xfe.jpg", "wb") as fh:
        fh.write(b"not a jpeg")
    return root


@pytest.mark.parametrize("fmt", format_names())
def test_names_that_are_not_utf8_pack_and_resume(tmp_path, fmt):
    src = non_utf8_tree(tmp_path / "src")
    args = [src, "--to", fmt, "--resize", "24", "--workers", "1", "-q", "--shards", "2"]
    # Killed right after the first part is recorded (its skips, with the odd name, in the progress file).
    killed = tmp_path / "killed"
    inject = ["-e", "trace=rename", "-e", "inject=rename:signal=SIGKILL:when=2"]
    rc, _ = run_pack(*args, "-o", killed, strace=inject)
    assert rc != 0
    rc, text = run_pack(*args, "-o", killed, "--resume")
    assert rc == 0, text
    manifest = read_manifest(killed)
    assert [os.fsencode(c) for c in manifest.classes] == [b"cat", b"d\xffog"]
    assert [os.fsencode(s["path"]) for s in manifest.skipped] == [b"cat/bad\xfe.jpg"]
    assert sorted(label for _, label in open_dataset(killed, decode="numpy")) == [0, 0, 0, 1, 1, 1]
    assert verify_dataset(killed).ok


def test_long_bmp_names_colliding_across_extensions(tmp_path):
    stem = "é" * 80 + "x" * 90  # 250 bytes: "<stem>.jpg" fits, "<stem>.jpg.bmp" would not
    (tmp_path / "src" / "c").mkdir(parents=True)
    _image(tmp_path / "src" / "c" / f"{stem}.jpg", 10)
    Image.new("RGB", (20, 20), (1, 2, 3)).save(tmp_path / "src" / "c" / f"{stem}.png")
    pack_folder(tmp_path / "src", tmp_path / "ds", "bmp", SMALL, workers=1)
    names = sorted(p.name for p in (tmp_path / "ds" / "c").iterdir())
    assert len(names) == 2 and all(len(os.fsencode(n)) <= 255 for n in names)
    assert verify_dataset(tmp_path / "ds").ok
    assert [label for _, label in open_dataset(tmp_path / "ds", decode="numpy")] == [0, 0]


def _classes_copy(root: Path) -> Path:
    for name in ("animals", "plants"):
        shutil.copytree(SAMPLE_DATA / name, root / name)
    return root


def test_symlink_loops_and_links_into_another_class_are_skipped_with_a_reason(tmp_path):
    src = _classes_copy(tmp_path / "src")
    plain = pack_folder(src, tmp_path / "plain", "lmdb", SMALL, workers=1)
    os.symlink("..", src / "animals" / "up")  # loops back to the root: every class again
    os.symlink("../plants", src / "animals" / "flowers")  # another class's images
    os.symlink(".", src / "plants" / "self")
    report = pack_folder(src, tmp_path / "ds", "lmdb", SMALL, workers=1)
    assert report.packed == plain.packed  # nothing packed twice, nothing under the wrong label
    reasons = {s["path"]: s["reason"] for s in read_manifest(tmp_path / "ds").skipped}
    assert "symlink loop" in reasons["animals/up"] and "symlink loop" in reasons["plants/self"]
    assert "another class" in reasons["animals/flowers"]
    labels = [label for _, label in open_dataset(tmp_path / "ds", decode="bytes")]
    plain_labels = [label for _, label in open_dataset(tmp_path / "plain", decode="bytes")]
    assert labels == plain_labels


def test_an_unreadable_subfolder_is_listed_in_skipped(tmp_path):
    src = _classes_copy(tmp_path / "src")
    shutil.copytree(SAMPLE_DATA / "plants", src / "plants" / "more")
    # Root reads any folder, so the refusal is injected: every open of plants/more fails EACCES.
    inject = ["-P", str(src / "plants" / "more"), "-e", "trace=openat", "-e", "inject=openat:error=EACCES"]
    rc, text = run_pack(src, "--to", "lmdb", "-o", tmp_path / "ds", "--resize", "24", "-q", strace=inject)
    assert rc == 0, text
    skipped = read_manifest(tmp_path / "ds").skipped
    assert {"path": "plants/more", "reason": "folder not readable (Permission denied)"} in skipped
