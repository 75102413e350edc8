"""Where an append writes: a local dataset folder or a dataset behind a URL (packer/edit/append.py).

Both take the new data files from a local staging folder, never replacing an existing file, and
write small files (sidecars, the source-path list, the manifest last) whole: atomically locally,
as one object PUT remotely (an object appears whole or not at all)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from readers.errors import ImgpackError
from readers.remote.urls import join_url, url_fs
from readers.store.manifest import MANIFEST_NAME, Manifest, write_atomic, write_manifest

STAGING = ".imgpack-append"


class Place(Protocol):
    name: str
    staging: Path  # the local folder the new samples are packed into

    def read(self, name: str) -> bytes: ...
    def size(self, name: str) -> int | None: ...
    def write(self, name: str, data: bytes) -> None: ...
    def move_in(self, src: Path, name: str) -> None: ...
    def write_manifest(self, manifest: Manifest) -> None: ...


class LocalPlace:
    def __init__(self, root: Path):
        self.root, self.name, self.staging = root, str(root), root / STAGING

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def size(self, name: str) -> int | None:
        path = self.root / name
        return path.stat().st_size if path.exists() else None

    def write(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data)

    def move_in(self, src: Path, name: str) -> None:
        dst = self.root / name
        if src.is_dir() and dst.is_dir():  # a folder both have (the BMP cache's class folders)
            for entry in sorted(os.listdir(src)):
                self.move_in(src / entry, f"{name}/{entry}")
            return
        if dst.exists():
            raise ImgpackError(f"{dst}: already in the dataset; the append would replace it (remove {src})")
        os.replace(src, dst)

    def write_manifest(self, manifest: Manifest) -> None:
        write_manifest(self.root, manifest)


class RemotePlace:
    """A dataset at ``url``; its staging folder is local, named after the URL (so --resume finds it)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None):
        self.fs, self.base = url_fs(url, storage_options)
        self.name = url
        digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
        self.staging = Path(tempfile.gettempdir()) / f"imgpack-append-{digest}"

    def _path(self, name: str) -> str:
        return join_url(self.base, name)

    def read(self, name: str) -> bytes:
        return bytes(self.fs.cat_file(self._path(name)))

    def size(self, name: str) -> int | None:
        try:
            return int(self.fs.size(self._path(name)))
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(name), data)

    def move_in(self, src: Path, name: str) -> None:
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
        for path in files:
            rel = name if path == src else f"{name}/{path.relative_to(src).as_posix()}"
            there = self.size(rel)
            if there is not None and there != path.stat().st_size:
                raise ImgpackError(f"{self.name}/{rel}: already in the dataset; the append would replace it")
            if there is None:  # the same size: uploaded by an interrupted graft, not yet unlinked
                self.fs.put_file(str(path), self._path(rel))
            path.unlink()  # uploaded: a resumed graft uploads only what is left
        if src.is_dir():
            shutil.rmtree(src)

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.validate(self.name)
        self.write(MANIFEST_NAME, manifest.to_json().encode())
