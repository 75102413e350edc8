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

from packer.source import IMAGE_EXTENSIONS, SourceItem, SourceScan
from readers.errors import ImgpackError
from readers.manifest import MANIFEST_NAME, PROGRESS_NAME
from readers.remote import remote_call, url_fs

READ_THREADS = 8  # objects read at once by one worker process


def _hidden(name: str) -> bool:
    return name.startswith(".")


def scan_url(url: str, storage_options: dict[str, Any] | None = None) -> SourceScan:
    """The image folder at ``url`` (``url/<class>/**/<image>``), listed in one pass."""
    fs, root = url_fs(url, storage_options)
    root = root.rstrip("/")
    # Names only (not fsspec's info dicts): a listing of millions of objects stays a list of str.
    listing = remote_call(url, "listing the source", fs.find, root)
    top = remote_call(url, "listing the source", fs.ls, root, detail=True) if listing else []
    if not listing and not remote_call(url, "listing the source", fs.exists, root):
        raise ImgpackError(f"{url}: no such folder; give the root of an image folder (root/<class>/<image>)")
    # Folders below the root are classes even when empty (S3: a "folder/" marker object).
    class_names = {
        info["name"].rstrip("/").rsplit("/", 1)[-1] for info in top if info.get("type") == "directory"
    }
    class_names = {name for name in class_names if not _hidden(name)}
    files: dict[str, list[str]] = {}  # class -> paths inside it
    ignored = 0
    for path in listing:
        parts = path[len(root) :].strip("/").split("/")
        if not parts[0] or _hidden(parts[0]) or len(parts) == 1 or path.endswith("/"):
            continue  # hidden, a file beside the classes, or a folder marker
        class_names.add(parts[0])
        if any(_hidden(p) for p in parts[1:-1]):
            continue  # below a hidden folder: not looked at
        name = parts[-1]
        if _hidden(name) or not name.lower().endswith(IMAGE_EXTENSIONS):
            ignored += 1
            continue
        files.setdefault(parts[0], []).append("/".join(parts[1:]))
    classes = sorted(class_names)
    if not classes:
        _refuse_packed_dataset(url, listing, root)
        raise ImgpackError(
            f"{url}: no class folders found; expected root/<class>/<image> (ImageFolder layout)"
        )
    items: list[SourceItem] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        found = sorted(files.get(name, []))
        if not found:
            empty.append(name)
        for rel in found:
            url_of = fs.unstrip_protocol(f"{root}/{name}/{rel}")
            items.append(SourceItem(len(items), url_of, f"{name}/{rel}", label))
    if not items:
        _refuse_packed_dataset(url, listing, root)
        raise ImgpackError(
            f"{url}: no image files in any class folder (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return SourceScan(url.rstrip("/"), classes, items, empty, ignored, [])


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
