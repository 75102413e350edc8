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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packer.scan.source_items import ItemsBuilder, SourceItem, SourceItems
from readers.errors import ImgpackError
from readers.store.manifest import MANIFEST_NAME, PROGRESS_NAME

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


@dataclass
class SourceScan:
    """A scanned source. ``items`` may be given as a list of ``SourceItem``; it is kept as the
    compact ``SourceItems`` (see packer/scan/source_items.py), which reads like that list (a list of
    a subclass of ``SourceItem`` is kept as given)."""

    root: Path | str  # a local folder, or the URL of a remote one (packer/sources/remote_source.py)
    classes: list[str]
    items: SourceItems | list[SourceItem]
    empty_classes: list[str] = field(default_factory=list)
    ignored: int = 0  # non-image and hidden files
    skipped: list[dict[str, str]] = field(default_factory=list)  # not packed, with the reason
    extra: dict[str, str] = field(default_factory=dict)  # recorded in the manifest's extra
    # The per-sample fields' schema ({name: kind}, readers/fields/field_schema.py); the values ride
    # on the items.
    fields: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Only plain SourceItems are made compact: a subclass's own fields would be lost.
        if not isinstance(self.items, SourceItems) and all(type(i) is SourceItem for i in self.items):
            self.items = SourceItems.from_items(self.items)

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


class ClassWalk:
    """The image files below one class folder, streamed in sorted order, one folder at a time.

    A folder's entries are sorted with sub-folders keyed ``name + "/"``: that is the order of the
    full relative paths, so the stream equals ``sorted()`` of every path without holding them
    all. ``ignored`` counts non-image and hidden files; ``problems`` lists the folders not read
    (unreadable, or symlinks that loop or leave the class) as ``{"path", "reason"}``.
    """

    def __init__(self, class_dir: Path, root: Path, problems: list[dict[str, str]]) -> None:
        self.class_dir, self.root = class_dir, root
        self.class_real, self.root_real = os.path.realpath(class_dir), os.path.realpath(root)
        self.problems = problems
        self.ignored = 0
        self.visited: set[str] = set()

    def _rel(self, path: str) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    def files(self) -> Iterator[str]:
        """Posix paths relative to the class folder, sorted."""
        stack = [iter(self._entries(str(self.class_dir), ""))]
        while stack:
            entry = next(stack[-1], None)
            if entry is None:
                stack.pop()
            elif isinstance(entry, str):
                yield entry
            else:
                stack.append(iter(self._entries(entry[1], entry[0])))

    def _entries(self, folder: str, rel: str) -> list[str | tuple[str, str]]:
        """One folder's images (rel path) and sub-folders ``(rel path + "/", path)``, sorted."""
        real = os.path.realpath(folder)
        if real in self.visited:  # a second link to the same directory
            return []
        self.visited.add(real)
        found: list[str | tuple[str, str]] = []
        try:
            with os.scandir(folder) as listing:
                for entry in listing:  # not listed first: a folder can hold millions of files
                    self._add(entry, rel, found)
        except OSError as exc:
            reason = f"folder not readable ({exc.strerror})"
            self.problems.append({"path": self._rel(exc.filename or folder), "reason": reason})
            return []
        found.sort(key=lambda e: e if isinstance(e, str) else e[0])
        return found

    def _add(self, entry: os.DirEntry, rel: str, found: list[str | tuple[str, str]]) -> None:
        name = entry.name
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            if _hidden(name) or not name.lower().endswith(IMAGE_EXTENSIONS):
                self.ignored += 1
            else:
                found.append(rel + name)
        elif not _hidden(name):
            problem = (
                _link_problem(entry.path, self.class_real, self.root_real) if entry.is_symlink() else None
            )
            if problem:
                self.problems.append({"path": self._rel(entry.path), "reason": problem})
            else:
                found.append((rel + name + "/", entry.path))


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
    empty: list[str] = []
    skipped: list[dict[str, str]] = []
    ignored = 0
    try:
        items = ItemsBuilder(str(root / "x")[:-1])  # path = this prefix + rel
        for label, name in enumerate(classes):
            walk = ClassWalk(root / name, root, skipped)
            before = len(items)
            for rel in walk.files():
                items.add(f"{name}/{rel}", label)
            ignored += walk.ignored
            if len(items) == before:
                empty.append(name)
        table = items.build()
    except OSError as exc:  # the table's temporary files (ClassWalk records unreadable folders)
        raise ImgpackError(
            f"{root}: cannot write the scan's temporary table in {tempfile.gettempdir()} "
            f"({exc.strerror or exc}); free space there or point TMPDIR at another folder"
        ) from None
    if not items:
        _refuse_packed_dataset(root)
        raise ImgpackError(
            f"{root}: no image files in any class folder (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return SourceScan(root, classes, table, empty, ignored, skipped)
