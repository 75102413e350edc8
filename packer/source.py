"""Scanning an image folder ``root/<class>/**/<file>`` the way torchvision's ImageFolder does.

Classes are the sorted names of the top-level directories; files are found recursively inside
each class (extensions case-insensitive, hidden files and directories ignored, symlinked
directories followed once) and ordered by class, then by relative path. A symlinked directory
that loops (points to a folder containing it) or leads into another class folder is not followed,
and a folder that cannot be listed is not silently dropped: both are recorded in ``skipped``
(they become entries of the manifest's ``skipped``). A sample's index in
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
    skipped: list[dict[str, str]] = field(default_factory=list)  # not packed, with the reason
    extra: dict[str, str] = field(default_factory=dict)  # recorded in the manifest's extra

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


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _link_problem(link: str, class_real: str, root_real: str) -> str | None:
    """Why the symlinked directory ``link`` must not be followed (None: follow it)."""
    target = os.path.realpath(link)
    if _inside(os.path.realpath(os.path.dirname(link)), target):
        return "symlink loop (points to a folder that contains it); not followed"
    if _inside(target, root_real) and not _inside(target, class_real):
        return "symlink into another class folder (its images would get the wrong label); not followed"
    return None


def _class_files(class_dir: Path, root: Path) -> tuple[list[str], int, list[dict[str, str]]]:
    """Image files below class_dir (posix paths relative to it, sorted), the ignored count, and
    the folders that were not read (unreadable, or symlinks that loop or leave the class), with
    the reason, as ``{"path": relative to root, "reason": ...}``."""
    found: list[str] = []
    ignored = 0
    problems: list[dict[str, str]] = []
    visited: set[str] = set()
    class_real, root_real = os.path.realpath(class_dir), os.path.realpath(root)

    def rel(path: str) -> str:
        return Path(os.path.relpath(path, root)).as_posix()

    def unreadable(exc: OSError) -> None:
        problems.append({"path": rel(exc.filename), "reason": f"folder not readable ({exc.strerror})"})

    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True, onerror=unreadable):
        real = os.path.realpath(dirpath)
        if real in visited:  # a second link to the same directory
            dirnames[:] = []
            continue
        visited.add(real)
        kept = []
        for d in dirnames:
            path = os.path.join(dirpath, d)
            problem = None
            if not _hidden(d) and os.path.islink(path):
                problem = _link_problem(path, class_real, root_real)
            if problem:
                problems.append({"path": rel(path), "reason": problem})
            elif not _hidden(d):
                kept.append(d)
        dirnames[:] = kept
        base = Path(dirpath).relative_to(class_dir)
        for name in filenames:
            if _hidden(name) or not name.lower().endswith(IMAGE_EXTENSIONS):
                ignored += 1
                continue
            found.append((base / name).as_posix())
    return sorted(found), ignored, problems


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
    skipped: list[dict[str, str]] = []
    ignored = 0
    for label, name in enumerate(classes):
        files, hidden, problems = _class_files(root / name, root)
        ignored += hidden
        skipped += problems
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
    return SourceScan(root, classes, items, empty, ignored, skipped)
