"""A dataset's part files, as every reader opens them: lazily, in the process that reads (after a
DataLoader fork or spawn), checked against the manifest (present, plain, long enough, their
sha256 with ``verify``), never paired with a manifest once ``pack --force`` replaced the
directory, and dropped when pickled, so a reader can be handed to worker processes freely.
``PartFiles`` is the base of every format's reader (readers/formats/base.py).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from readers.errors import DatasetReplacedError, ImgpackError, ManifestError, OptionError
from readers.remote.remote_parts import RemoteParts
from readers.remote.urls import is_url
from readers.store.checksums import check_against_manifest, file_sha256
from readers.store.manifest import Manifest
from readers.store.paths import inside


def open_shard_file(
    path: str, shard: Any, check_sha: bool, load_index: Callable[[], Any], where: str = ""
) -> tuple[int, Any]:
    """A local shard file opened read-only, checked present, as long as the manifest says and
    (``check_sha``) matching its sha256, with its index from ``load_index()``: ``(fd, index)``.
    The descriptor is closed again if any check fails; errors name ``where`` (default ``path``)."""
    where = where or path
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ManifestError(
            f"{where}: shard listed in the manifest is missing; copy it again or re-pack the dataset"
        ) from None
    try:
        st = os.fstat(fd)
        check_regular(st, where)
        size = st.st_size
        if size < shard.bytes:
            raise ManifestError(
                f"{where}: shard is truncated ({size} of {shard.bytes} bytes); "
                "copy it again or re-pack the dataset"
            )
        if check_sha:
            check_against_manifest(where, file_sha256(path), shard.sha256)
        return fd, load_index()
    except BaseException:
        os.close(fd)
        raise


def read_all(fd: int, size: int) -> bytes:
    """``size`` bytes from the start of ``fd`` (fewer only where the file is shorter)."""
    chunks, got = [], 0
    while got < size:
        chunk = os.pread(fd, size - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def shards_holding(manifest: Manifest, indices: np.ndarray) -> list[int]:
    """Positions (ascending) of the shards of ``manifest`` that hold the samples ``indices``."""
    firsts = np.array([s.first for s in manifest.shards], dtype=np.int64)
    return np.unique(np.searchsorted(firsts, np.asarray(indices, dtype=np.int64), side="right") - 1).tolist()


def dir_identity(root: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_regular(st: os.stat_result, where: str) -> None:
    """A part the manifest lists must be a plain file (a directory in its place is a bad copy)."""
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(
            f"{where}: is a directory or special file, not the data file the manifest lists; "
            "copy that file again or re-pack the dataset"
        )


class PartFiles:
    # Formats that check a shard only when it is opened (so one damaged shard leaves the others
    # readable) set this; `pack info` then opens each shard once (check_every_part).
    checks_shards_on_open: ClassVar[bool] = False

    def __init__(
        self,
        root: str | os.PathLike,
        manifest: Manifest,
        verify: bool = False,
        cache_dir: str | os.PathLike | None = None,
        cache_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ):
        self.remote = is_url(root)
        if cache_dir is not None and not self.remote:
            raise OptionError(f"{root}: cache_dir is for datasets behind a URL; this one is local")
        self.root: str | Path = root if is_url(root) else Path(root)
        # Behind a URL: parts are fetched through this (see readers.remote.remote_parts).
        self.parts = RemoteParts(str(root), storage_options, cache_dir, cache_size) if self.remote else None
        self.cache_dir = cache_dir
        self.manifest = manifest
        self.verify = verify
        self._handles: dict[Any, Any] = {}
        self._pid = os.getpid()
        self._sha_checked: set[tuple] = set()
        # The directory this reader opened: `pack --force` swaps a new one in under the same path,
        # and a part opened after that must never be paired with this manifest (see handle()).
        self._identity = None if self.remote else dir_identity(self.root)
        self.ahead: Any = None  # during a pass behind a URL: what is fetched ahead (remote_ahead.py)

    def check_parts(self) -> None:
        """Check, cheaply and before any read, that each part holds what the manifest says.

        Called by ``open_reader`` for local datasets; formats override it.
        """

    def check_parts_of(self, positions: Sequence[int]) -> None:
        """``check_parts`` for the shards at ``positions`` only (a view's parent: the parts its
        samples lie in); formats whose check is costly (hashing under ``verify``) override it."""
        self.check_parts()

    def check_every_part(self) -> None:
        """What ``pack info`` checks: ``check_parts``, and, where the format checks shards as it
        opens them, each shard opened once (present, a plain file, as long as the manifest says)."""
        self.check_parts()
        if self.checks_shards_on_open:
            for position in range(len(self.manifest.shards)):
                self._close_handle(self._open_unreplaced(position))

    def checked_parts(self) -> list[tuple[PartFiles, Any]]:
        """(reader, shard) of each part ``pack verify`` checksums: this reader's shards (a view
        lists its parent's shards that hold its samples, readers/datasets/views.py)."""
        return [(self, shard) for shard in self.manifest.shards]

    def location(self, name: str) -> str:
        """Where part ``name`` lives, for messages: its URL, or its path in the dataset directory."""
        return self.parts.url(name) if self.parts is not None else str(self.part_path(name))

    def local_file(self, shard: Any) -> str:
        """A local path of the file the manifest checksums for ``shard``: in the dataset directory,
        or (behind a URL) its copy in the part cache, downloaded and checked against the
        manifest's size and sha256 first."""
        if self.parts is None:
            return str(self.checksum_path(shard))
        name, size = self.checksum_name(shard), self.checksum_size(shard)
        path = self.parts.local(name, size, shard.sha256, self.verify)
        if self.verify:  # checked by the cache (once per process): check_sha256 need not hash it again
            st = os.stat(path)
            self._sha_checked.add((os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return str(path)

    def sidecar_names(self, shard: Any) -> list[str]:
        """Files next to ``shard`` that opening it reads through the part cache (its index)."""
        return []

    def fetch_sidecars(self, shard: Any) -> None:
        """``shard``'s sidecars into the part cache ahead of its opening (as fetched: the opening
        checks them, and fetches a bad copy again)."""
        if self.parts is not None:
            for name in self.sidecar_names(shard):
                self.parts.index(name, shard.sha256, lambda text, where: None)

    def part_path(self, name: str) -> Path:
        """``root / name`` for a name from the manifest or an index, refused if it leaves the dataset."""
        root = self.root
        if not isinstance(root, Path):  # a URL: its parts go through self.parts
            raise TypeError(f"{root}: part_path is for local datasets")
        path = root / name
        inside(root, path, f"{root}: {name}")
        return path

    def describe(self, index: int) -> str:
        """Where global sample ``index`` lives, for error messages: dataset, part and index."""
        shard = self.manifest.shards[self.manifest.shard_of(index)] if self.manifest.shards else None
        part = f", part {shard.file}" if shard is not None else ""
        return f"{self.root}{part}, sample {index}"

    def check_sha256(self, path: str | os.PathLike, expected: str, where: str) -> None:
        """With ``verify``: the file's sha256 must match the manifest; checked once per process.

        Run before a library parses the file, so a corrupt LMDB or HDF5 file is refused instead
        of being mapped or parsed (where a flipped bit can crash the process).
        """
        if not self.verify:
            return
        st = os.stat(path)
        check_regular(st, where)
        key = (os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._sha_checked:
            return
        check_against_manifest(where, file_sha256(path), expected)
        self._sha_checked.add(key)

    def checksum_name(self, shard: Any) -> str:
        """The name (relative to the root) of the file whose sha256 the manifest records for ``shard``."""
        return shard.file

    def checksum_size(self, shard: Any) -> int | None:
        """The size of that file, as the manifest records it (None where it does not)."""
        return shard.bytes

    def checksum_path(self, shard) -> Path:
        """The file whose sha256 the manifest records for ``shard`` (local datasets)."""
        return self.part_path(self.checksum_name(shard))

    def _open(self, key: Any) -> Any:
        """Open the handle called ``key`` (a shard position, say) in this process."""
        raise NotImplementedError

    def _close_handle(self, handle: Any) -> None:
        close = getattr(handle, "close", None)
        if close is not None:
            close()

    # -- shared machinery ---------------------------------------------------------------------
    def handle(self, key: Any = 0) -> Any:
        if self._pid != os.getpid():  # forked: never use the parent's handles
            self._handles = {}
            self._pid = os.getpid()
        handle = self._handles.get(key)
        if handle is None:
            handle = self._handles[key] = self._open_unreplaced(key)
        return handle

    def _open_unreplaced(self, key: Any) -> Any:
        """``_open(key)``, refused if the dataset directory is no longer the one this reader opened.

        Checked after the open: a part opened before a swap holds the old samples, one opened
        after it is caught here; either way no new file is read with the old manifest."""
        try:
            handle = self._open(key)
        except (ImgpackError, OSError) as exc:  # a part gone or changed, as a replaced dataset's are
            self.check_not_replaced(exc)
            raise
        try:
            self.check_not_replaced()
        except DatasetReplacedError:
            self._close_handle(handle)
            raise
        return handle

    def pin_directory(self, identity: tuple[int, int] | None) -> None:
        """Take ``identity`` (of the directory before its manifest was read) as the dataset's: a
        swap between reading the manifest and opening this reader is refused now, not later."""
        self._identity = identity
        self.check_not_replaced()

    def check_not_replaced(self, cause: BaseException | None = None) -> None:
        """Raise ``DatasetReplacedError`` if the dataset directory was replaced since the open."""
        if self._identity is None or dir_identity(self.root) == self._identity:
            return
        raise DatasetReplacedError(
            f"{self.root}: the dataset was replaced (by `pack --force`, or removed) after this reader "
            "opened it; the parts it had open still give the old samples, the others are gone: "
            "open the dataset again (open_dataset / open_iterable) to read the new one"
        ) from cause

    def close(self) -> None:
        if self._pid == os.getpid():
            for handle in self._handles.values():
                self._close_handle(handle)
        self._handles = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        state["ahead"] = None  # requests in flight belong to the process that made them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
