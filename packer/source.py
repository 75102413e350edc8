"""Scanning an image folder ``root/<class>/**/<file>`` the way torchvision's ImageFolder does.

Classes are the sorted names of the top-level directories; files are found recursively inside
each class (extensions case-insensitive, hidden files and directories ignored, symlinked
directories followed once) and ordered by class, then by relative path. A sample's index in
this order is its identity everywhere else (keys, shard ranges, manifests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from readers.errors import ImgpackError
from readers.manifest import MANIFEST_NAME, PROGRESS_NAME

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".pgm",
    ".pbm",
    ".bmp",
    ".tif",
    ".tiff",
    ".webp",
    ".gif",
)


@dataclass(frozen=True)
class SourceItem:
    index: int  # position in the sorted source order
    path: str  # absolute path
    rel: str  # posix path relative to the source root, as recorded in manifests
    label: int


@dataclass
class SourceScan:
    root: Path
    classes: list[str]
    items: list[SourceItem]
    empty_classes: list[str] = field(default_factory=list)
    ignored: int = 0  # non-image and hidden files

    def __len__(self) -> int:
        return len(self.items)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def find_classes(root: Path) -> list[str]:
    """Sorted class directory names (symlinks to directories count, hidden ones do not)."""
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        raise ImgpackError(f"{root}: cannot list the folder ({exc.strerror})") from None
    return sorted(e.name for e in entries if not _hidden(e.name) and e.is_dir(follow_symlinks=True))


def _class_files(class_dir: Path) -> tuple[list[str], int]:
    """Image files below class_dir (posix paths relative to it, sorted) and the ignored count."""
    found: list[str] = []
    ignored = 0
    visited: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:  # a symlink cycle or a second link to the same directory
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = [d for d in dirnames if not _hidden(d)]
        base = Path(dirpath).relative_to(class_dir)
        for name in filenames:
            if _hidden(name) or not name.lower().endswith(IMAGE_EXTENSIONS):
                ignored += 1
                continue
            found.append((base / name).as_posix())
    return sorted(found), ignored


def _refuse_packed_dataset(root: Path) -> None:
    """A source with no images that is itself imgpack output gets told so (not "no image files")."""
    marker = next((name for name in (MANIFEST_NAME, PROGRESS_NAME) if (root / name).is_file()), None)
    if marker is not None:
        raise ImgpackError(
            f"{root}: this is an imgpack dataset (it has {marker}), not an image folder; "
            "pack the original image folder instead, or read this one with readers.open_dataset"
        )


def scan_folder(root: str | os.PathLike) -> SourceScan:
    root = Path(root).expanduser()
    if not root.exists():
        raise ImgpackError(f"{root}: no such folder; give the root of an image folder (root/<class>/<image>)")
    if not root.is_dir():
        raise ImgpackError(f"{root}: not a folder; give the root of an image folder (root/<class>/<image>)")
    classes = find_classes(root)
    if not classes:
        _refuse_packed_dataset(root)
        raise ImgpackError(
            f"{root}: no class folders found; expected root/<class>/<image> (ImageFolder layout)"
        )
    items: list[SourceItem] = []
    empty: list[str] = []
    ignored = 0
    for label, name in enumerate(classes):
        files, skipped = _class_files(root / name)
        ignored += skipped
        if not files:
            empty.append(name)
        for rel in files:
            rel_path = f"{name}/{rel}"
            items.append(SourceItem(len(items), str(root / name / rel), rel_path, label))
    if not items:
        _refuse_packed_dataset(root)
        raise ImgpackError(
            f"{root}: no image files in any class folder (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return SourceScan(root, classes, items, empty, ignored)
