"""Datasets behind fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...) and a local shard cache.

``fsspec`` is imported only when a URL is used, so local reading stays light. Credentials and
endpoints come from the usual places (environment, config files) or from ``storage_options``,
passed to ``fsspec`` unchanged (e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for s3fs).

The shard cache is content-addressed: a shard is stored as ``<sha256>.tar`` under ``cache_dir``,
so a re-packed dataset never reads a stale copy and several processes can share one cache. A
download goes to a temporary name, is checked against the manifest's size and sha256, then
renamed into place, so a partial or corrupt download is never used. A lock file per shard makes
concurrent DataLoader workers wait for one download instead of each fetching the shard.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from readers.errors import ChecksumError, ManifestError

DOWNLOAD_CHUNK = 4 << 20


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path


def join_url(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def url_fs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``url``."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ManifestError(f"{url}: reading URLs needs fsspec: pip install fsspec") from None
    try:
        return url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        raise ManifestError(
            f"{url}: no fsspec backend for this URL ({exc}); install it, e.g. pip install s3fs"
        ) from None


def read_url(url: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """The whole object at ``url``; FileNotFoundError if it does not exist."""
    fs, path = url_fs(url, storage_options)
    return fs.cat_file(path)


class ShardCache:
    """Whole shards downloaded once into ``cache_dir``, least recently used evicted past ``max_bytes``."""

    def __init__(self, cache_dir: str | os.PathLike, max_bytes: int | None = None):
        self.dir = Path(cache_dir).expanduser()
        self.max_bytes = max_bytes
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        return self.dir / f"{sha256}.tar"

    def get(self, fs: Any, remote: str, url: str, size: int, sha256: str) -> Path:
        """Local copy of the shard at ``url`` (fetched if absent), checked against size and sha256."""
        import fcntl

        final = self.path(sha256)
        if self._usable(final, size):
            return final
        with open(self.dir / f"{sha256}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be fetching this shard right now
            if not self._usable(final, size):
                self._download(fs, remote, url, final, size, sha256)
        self.evict(keep=final)
        return final

    def _usable(self, path: Path, size: int) -> bool:
        try:
            if path.stat().st_size != size:
                return False
            os.utime(path)  # mark as recently used
            return True
        except FileNotFoundError:
            return False

    def _download(self, fs: Any, remote: str, url: str, final: Path, size: int, sha256: str) -> None:
        tmp = final.with_name(f".{final.name}.{os.getpid()}.part")
        digest = hashlib.sha256()
        got = 0
        try:
            with fs.open(remote, "rb", block_size=DOWNLOAD_CHUNK) as src, open(tmp, "wb") as dst:
                while chunk := src.read(DOWNLOAD_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    got += len(chunk)
            if got != size or digest.hexdigest() != sha256:
                raise ChecksumError(
                    f"{url}: downloaded {got} bytes (manifest: {size}) whose sha256 does not match the "
                    "manifest; the remote shard is truncated or modified, re-upload or re-pack it"
                )
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def evict(self, keep: Path | None = None) -> None:
        if self.max_bytes is None:
            return
        entries = []
        for path in self.dir.glob("*.tar"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            # Open handles in other processes keep working: unlinking only drops the name.
            path.unlink(missing_ok=True)
            total -= size
