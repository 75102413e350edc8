"""The parts of a dataset behind a URL, as local files: downloaded whole, once, into a cache.

LMDB, HDF5 and TFRecord readers need a local file (a memory map, the HDF5 library, ``pread``),
so a remote part is downloaded whole into the ``ShardCache`` of ``readers.remote.urls`` (checked
against the manifest's size and sha256 before it is renamed into place, least recently used
parts evicted past ``cache_size``) and read from there. Tar shards may also be read by ranged
requests, and the BMP cache's per-image files are fetched one request each.

Without a ``cache_dir`` the parts go to ``default_cache_dir()``: ``$IMGPACK_CACHE_DIR``, else
``$XDG_CACHE_HOME/imgpack``, else ``~/.cache/imgpack``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from readers.errors import ManifestError, OptionError
from readers.remote.urls import RemoteError, ShardCache, join_url, keep_inherited, remote_call, url_fs

T = TypeVar("T")


def default_cache_dir() -> Path:
    explicit = os.environ.get("IMGPACK_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "imgpack"


_MAKING = threading.Lock()  # held while a filesystem is looked up or made
os.register_at_fork(after_in_child=lambda: globals().update(_MAKING=threading.Lock()))  # never inherited held


class RemoteParts:
    """One remote dataset root: its fsspec filesystem and a local part cache.

    Both are made lazily in the process that reads and dropped when pickled or forked (an fsspec
    filesystem and its event loop must not cross a fork), like a reader's file handles.
    """

    def __init__(
        self,
        root: str,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_size: int | None = None,
    ):
        self.root = root
        self.storage_options = dict(storage_options or {})
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self._pid: int | None = None
        self._fs: tuple[Any, str] | None = None
        self._cache: ShardCache | None = None

    def _this_process(self) -> None:
        if self._pid != os.getpid():
            if self._fs is not None:  # the parent's, forked: never closed from here
                keep_inherited(self._fs[0])
            self._fs = self._cache = None
            self._pid = os.getpid()

    @property
    def fs(self) -> tuple[Any, str]:
        """(fsspec filesystem, the dataset root's path inside it), made once per process: the
        first reads of a DataLoader worker come from several threads at once."""
        with _MAKING:
            self._this_process()
            if self._fs is None:
                self._fs = url_fs(self.root, self.storage_options)
            return self._fs

    @property
    def cache(self) -> ShardCache:
        self._this_process()
        if self._cache is None:
            self._cache = ShardCache(self.cache_dir or default_cache_dir(), self.cache_size)
        return self._cache

    def url(self, name: str) -> str:
        return join_url(self.root, name)

    def remote_path(self, name: str) -> str:
        return join_url(self.fs[1], name)

    def local(self, name: str, size: int | None, sha256: str, verify: bool = False) -> Path:
        """The cached local copy of part ``name`` (downloaded and checked if absent or wrong)."""
        try:
            return self.cache.get(self.source(name), self.url(name), size, sha256, verify, Path(name).suffix)
        except FileNotFoundError:
            raise self.missing(name) from None

    def index(self, name: str, sha256: str, check: Callable[[str, str], T]) -> T:
        """``check(text, where)`` of the sidecar ``name`` of the part whose sha256 is ``sha256``,
        cached once; a cached copy that fails ``check`` is fetched again."""
        return self.cache.index(self.source(name), self.url(name), sha256, check)

    def source(self, name: str) -> Callable[[], tuple[Any, str]]:
        """(filesystem, path of ``name`` in it), made when first asked for."""
        return lambda: (self.fs[0], self.remote_path(name))

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object ``name`` (all of it by default), one request.

        A whole object is asked for as the range from byte 0: s3fs would first ask for its size
        (a second round trip for every index file and every BMP image). An empty object has no
        such range (HTTP 416): it is then read the plain way."""
        fs, _ = self.fs
        url, path = self.url(name), self.remote_path(name)
        try:
            if start is not None or end is not None:
                return remote_call(url, "reading", fs.cat_file, path, start=start, end=end)
            try:
                return remote_call(url, "reading", fs.cat_file, path, start=0)
            except RemoteError as exc:
                if "satisfiable" not in str(exc).lower():
                    raise
                return remote_call(url, "reading", fs.cat_file, path)
        except FileNotFoundError:
            raise self.missing(name) from None

    def missing(self, name: str) -> ManifestError:
        return ManifestError(
            f"{self.url(name)}: listed in the manifest but not found at the URL; upload the "
            "complete dataset again (or check the URL and storage_options)"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_fs": None, "_cache": None}


REMOTE_OPTIONS = ("storage_options", "cache_dir", "cache_size")


def merge_remote_options(reader_options: dict[str, Any] | None, **remote: Any) -> dict[str, Any]:
    """``reader_options`` plus the remote options given directly (``storage_options=``,
    ``cache_dir=``, ``cache_size=`` of ``open_dataset`` / ``open_iterable``), None ones left out."""
    merged = dict(reader_options or {})
    for key, value in remote.items():
        if value is None:
            continue
        if key in merged and merged[key] != value:
            raise OptionError(f"{key}= is given both directly and in reader_options; pass it once")
        merged[key] = value
    return merged
