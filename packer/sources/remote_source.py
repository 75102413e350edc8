"""An image folder behind an fsspec URL (``s3://bucket/train``, ``gs://...``, ``file://...``).

``scan_url`` lists the prefix once and returns the same ``SourceScan`` as ``scan_folder`` gives
for the same tree on local disk: classes are the first path component after the prefix, hidden
names and non-image files are left out the same way, files are ordered by class then by their
path inside it, so labels and sample indices do not depend on where the tree lives. An item's
``path`` is the object's URL; its bytes are read later, inside the workers (``read_objects``),
never by the process that scans.

Credentials and endpoints come from the environment / credential chain or ``storage_options``
(passed to fsspec unchanged); they are never put into a scan, a manifest or a message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from packer.scan.source_items import ItemsBuilder
from packer.sources.source import IMAGE_EXTENSIONS, SourceScan, scan_folder
from readers.errors import ImgpackError
from readers.remote.urls import is_url, remote_call, url_fs
from readers.store.manifest import MANIFEST_NAME, PROGRESS_NAME

READ_THREADS = 8  # objects read at once by one worker process


def _hidden(name: str) -> bool:
    return name.startswith(".")


def scan_url(url: str, storage_options: dict[str, Any] | None = None) -> SourceScan:
    """The image folder at ``url`` (``url/<class>/**/<image>``), listed one class at a time.

    All keys of a class share its prefix, so each class is listed, sorted and written into the
    compact item table on its own: the scan holds one class's names at a time, not the bucket's.
    """
    fs, root = url_fs(url, storage_options)
    root = root.rstrip("/")
    if not remote_call(url, "listing the source", fs.exists, root):
        raise ImgpackError(f"{url}: no such folder; give the root of an image folder (root/<class>/<image>)")
    top = remote_call(url, "listing the source", fs.ls, root, detail=True)
    # Folders below the root are classes even when empty (S3: a "folder/" marker object).
    names = {info["name"].rstrip("/").rsplit("/", 1)[-1] for info in top if info.get("type") == "directory"}
    classes = sorted(name for name in names if not _hidden(name))
    if not classes:
        _refuse_packed_dataset(url, [info["name"] for info in top], root)
        raise ImgpackError(
            f"{url}: no class folders found; expected root/<class>/<image> (ImageFolder layout)"
        )
    builder = ItemsBuilder(fs.unstrip_protocol(root) + "/")  # an item's path: this prefix + rel
    empty: list[str] = []
    ignored = 0
    for label, name in enumerate(classes):
        found, hidden = _class_files(url, fs, f"{root}/{name}")
        ignored += hidden
        if not found:
            empty.append(name)
        for rel in sorted(found):
            builder.add(f"{name}/{rel}", label)
    if not len(builder):
        _refuse_packed_dataset(url, [info["name"] for info in top], root)
        raise ImgpackError(
            f"{url}: no image files in any class folder (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return SourceScan(url.rstrip("/"), classes, builder.build(), empty, ignored, [])


def _class_files(url: str, fs: Any, folder: str) -> tuple[list[str], int]:
    """Image paths inside ``folder`` (relative to it) and the count of non-image files."""
    found: list[str] = []
    ignored = 0
    for path in remote_call(url, "listing the source", fs.find, folder):
        parts = path[len(folder) :].strip("/").split("/")
        if not parts[0] or path.endswith("/"):
            continue  # the folder's own marker object
        if any(_hidden(p) for p in parts[:-1]):
            continue  # below a hidden folder: not looked at
        if _hidden(parts[-1]) or not parts[-1].lower().endswith(IMAGE_EXTENSIONS):
            ignored += 1
            continue
        found.append("/".join(parts))
    return found, ignored


def _refuse_packed_dataset(url: str, listing: list[str], root: str) -> None:
    for marker in (MANIFEST_NAME, PROGRESS_NAME):
        if f"{root}/{marker}" in listing:
            raise ImgpackError(
                f"{url}: this is an imgpack dataset (it has {marker}), not an image folder; "
                "pack the original image folder instead, or read this one with readers.open_dataset"
            )


def read_objects(urls: list[str], storage_options: dict[str, Any] | None = None) -> Iterator[bytes | str]:
    """The bytes of each object, in order, as soon as each has arrived (``READ_THREADS`` reads in
    flight, so the caller works on one object while the next ones download); a string (the
    reason) where an object cannot be read (gone since the scan, or not readable). A failing
    server raises."""
    if not urls:
        return
    fs, _ = url_fs(urls[0], storage_options)

    def read(url: str) -> bytes | str:
        return remote_call(url, "reading", _read_or_reason, fs, url)

    yield from _reader_pool().map(read, urls)


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _reader_pool() -> ThreadPoolExecutor:
    """This process's reading threads (started once: starting threads per chunk costs more than
    a small read; a forked worker starts its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(READ_THREADS, thread_name_prefix="imgpack-read"))
    return _POOL[1]


def _read_or_reason(fs: Any, url: str) -> bytes | str:
    try:
        return fs.cat_file(fs._strip_protocol(url))
    except FileNotFoundError:
        return "object not found (deleted after the source was listed?); re-run the pack"
    except PermissionError:
        return "permission denied; grant read access to the object"


def scan_place(src: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> SourceScan:
    """The image folder ``src`` scanned: a local path (packer/sources/source.py) or an fsspec URL."""
    if is_url(src):
        return scan_url(str(src), storage_options)
    return scan_folder(src)
