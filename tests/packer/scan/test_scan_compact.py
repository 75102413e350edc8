"""The streamed, compact scan yields exactly the items of the plain list it replaced (issue 15)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

from packer.output.pack_order import order_record
from packer.output.progress import fingerprint
from packer.scan.source_items import SourceItems
from packer.sources.source import IMAGE_EXTENSIONS, SourceItem, SourceScan, scan_folder
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA

WEIRD = [  # bytes: some names are not UTF-8
    b"c1/a.jpg", b"c1/a/b.jpg", b"c1/a-b.jpg", b"c1/a b.jpg", b"c1/a.b/x.jpg", b"c1/ab/y.png",
    b"c1/A.JPG", b"c1/.x.jpg", b"c1/.hid/x.jpg", b"c1/notes.txt", b"c1/\xc3\xa9t\xc3\xa9.jpg",
    b"c1/\xff\xfe.jpg", b"c1/\xff/deep/er/z.jpeg", b"c1/zz/\xe4\xb8\xad.jpg", b"c2/x/y/z/w.jpg",
    b"c2/x.jpg", b"c2/x0.jpg", b"c2/x/0.jpg", b"\xce\xb1class/q.webp", b"empty/readme.md",
]  # fmt: skip


def listed(root: Path) -> list[SourceItem]:
    """The scan as the old code built it: every image path below each class, sorted as strings."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    items = []
    for label, name in enumerate(classes):
        found = []
        for folder, dirs, files in os.walk(root / name):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            base = Path(folder).relative_to(root / name)
            found += [(base / f).as_posix() for f in files
                      if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS)]  # fmt: skip
        for rel in sorted(found):
            items.append(SourceItem(len(items), str(root / name / rel), f"{name}/{rel}", label))
    return items


def old_fingerprint(items: list[SourceItem]) -> bytes:
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.rel.encode("utf-8", "surrogateescape") + b"\0")
    return digest.digest()


@pytest.fixture
def weird_tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for name in WEIRD:
        path = os.path.join(os.fsencode(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    # A second way into c1/zz: scanned once, through the first name in sorted order (zz), so
    # the result no longer depends on the order the filesystem lists the folder in.
    os.symlink("zz", root / "c1" / "zzlink")
    return root


@pytest.mark.parametrize("which", ["sample_data", "weird"])
def test_compact_scan_equals_the_sorted_list(which: str, weird_tree: Path) -> None:
    root = SAMPLE_DATA if which == "sample_data" else weird_tree
    expected = listed(root)
    scan = scan_folder(root)
    assert isinstance(scan.items, SourceItems)
    assert list(scan.items) == expected and len(scan.items) == len(expected)
    assert [scan.items[i] for i in range(-len(expected), len(expected))] == expected + expected
    assert list(scan.items[3:11]) == expected[3:11] and list(scan.items[5:2]) == []
    assert list(scan.items[3:11][2:5]) == expected[5:8]  # a view of a view
    assert scan.items.rel_bytes().tobytes() == b"".join(
        i.rel.encode("utf-8", "surrogateescape") + b"\0" for i in expected
    )
    with pytest.raises(IndexError):
        scan.items[len(expected)]
    if which == "weird":
        assert scan.empty_classes == ["empty"] and scan.ignored == 3  # .x.jpg, notes.txt, readme.md
        assert any("\udcff" in i.rel for i in scan.items)  # a non-UTF-8 name kept byte for byte


def test_fingerprint_is_unchanged(weird_tree: Path) -> None:
    """The fingerprint hashes what was asked (the pack order included) and every relative path."""
    scan = scan_folder(weird_tree)
    spec, options, order = PreprocessSpec(), {"shards": 2}, order_record("shuffled", 0)
    head = hashlib.sha256()
    head.update(json.dumps(["tar", spec.to_dict(), options, scan.classes, order], sort_keys=True).encode())
    for item in listed(weird_tree):
        head.update(item.rel.encode("utf-8", "surrogateescape") + b"\0")
    assert fingerprint(scan, "tar", spec, options, order) == head.hexdigest()


def test_a_list_keeps_every_field(tmp_path: Path) -> None:
    """A SourceScan built from a list (image lists, s3:// sources) reads back exactly that list:
    shared-prefix paths, URL paths, paths that share no prefix, and non-consecutive indices."""
    prefixed = [
        SourceItem(i, f"s3://bucket/pre/c{i % 3}/k{i}.jpg", f"c{i % 3}/k{i}.jpg", i % 3) for i in range(20)
    ]
    mixed = [SourceItem(i + 5, f"/data/{i}/x{i}.png", f"other/x{i}\udcff.png", 7) for i in range(9)]
    mixed[4] = SourceItem(40, "/elsewhere.png", "n/a.png", 2)
    for items in (prefixed, mixed, []):
        scan = SourceScan(tmp_path, ["a"], list(items))
        assert isinstance(scan.items, SourceItems) and list(scan.items) == items
        assert list(pickle.loads(pickle.dumps(scan.items[2:6]))) == items[2:6]
    compact = SourceScan(tmp_path, ["a"], prefixed).items
    assert compact._paths is None and compact._indices is None  # the compact form was found
    assert SourceScan(tmp_path, ["a"], mixed).items._paths is not None


def test_a_pickled_part_carries_its_range_only(tmp_path: Path) -> None:
    items = [SourceItem(i, f"/src/c/{i:09d}.jpg", f"c/{i:09d}.jpg", 0) for i in range(20_000)]
    compact = SourceScan(tmp_path, ["c"], items).items
    part = compact[10_000:10_100]
    sent = pickle.dumps(part)
    assert len(sent) < len(pickle.dumps(compact)) / 50
    back = pickle.loads(sent)
    assert list(back) == items[10_000:10_100] and back[0].index == 10_000
    assert old_fingerprint(items[10_000:10_100]) == hashlib.sha256(back.rel_bytes()).digest()


def test_an_unwritable_temporary_folder_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    from readers.errors import ImgpackError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(ImgpackError, match="gone.*TMPDIR"):
        scan_folder(SAMPLE_DATA)


def test_a_list_of_a_subclass_is_kept_with_its_fields(tmp_path: Path) -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Sized(SourceItem):
        size: int = 0

    items = [Sized(i, f"s3://b/c/{i}.jpg", f"c/{i}.jpg", 0, size=10 + i) for i in range(3)]
    scan = SourceScan(tmp_path, ["c"], items)
    assert scan.items is items and [i.size for i in scan.items] == [10, 11, 12]
    expected = hashlib.sha256()
    order = order_record("source", 0)
    asked = ["tar", PreprocessSpec().to_dict(), {}, ["c"], order]
    expected.update(json.dumps(asked, sort_keys=True).encode())
    expected.update(b"c/0.jpg\0c/1.jpg\0c/2.jpg\0")
    assert fingerprint(scan, "tar", PreprocessSpec(), {}, order) == expected.hexdigest()
