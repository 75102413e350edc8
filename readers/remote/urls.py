"""Datasets behind fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...) and a local shard cache.

``fsspec`` is imported only when a URL is used, so local reading stays light. Credentials and
endpoints come from the usual places (environment, config files) or from ``storage_options``,
passed to ``fsspec`` unchanged (e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for s3fs).

The shard cache is content-addressed: a part is stored as ``<sha256><suffix>`` under ``cache_dir``
(``.tar``, ``.mdb``, ``.h5``, ``.tfrecord``, ``.jsonl``: the suffix of the file the manifest checksums),
so a re-packed dataset never reads a stale copy and several processes can share one cache. A
download goes to a temporary name, is checked against the manifest's size and sha256, then
renamed into place, so a partial or corrupt download is never used. A lock file per shard makes
concurrent DataLoader workers wait for one download instead of each fetching the shard.
A shard's ``.idx`` is cached next to it (``<sha256>.idx``), so a fully cached dataset makes no
remote request after its manifest. With ``verify=True`` a cached shard's sha256 is checked the
first time a process uses it, and a corrupt copy is downloaded again. Files left by killed
downloads (``.part``, ``.lock``) are removed when a cache is opened.

Every remote call is bounded: S3 and HTTP filesystems get connect and read timeouts and a small
number of retries (``REMOTE_DEFAULTS``; any key the user passes in ``storage_options`` wins, and
``storage_options["retries"]`` sets s3fs's own retry loop), and a failure becomes a
``RemoteError`` naming the URL, never an endless wait. Those per-request limits multiply (s3fs
nests its retry loop twice around botocore's attempts), so ``remote_call`` also waits for a call
at most ``IMGPACK_REMOTE_TIMEOUT`` seconds (default 120) without progress, whatever the backend
does: the call runs on a helper thread, and a stalled one is abandoned (it ends with its own
timeouts) while the caller gets the RemoteError. Streams (downloads, uploads) are bounded per
chunk or from their last progress, not in total.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from readers.errors import ChecksumError, ImgpackError, ManifestError, OptionError, warn
from readers.process import pid_alive
from readers.store.checksums import REMOTE_FIX, check_against_manifest, file_sha256

DOWNLOAD_CHUNK = 4 << 20
# Files next to a cached part that are not parts themselves (evicted with their part).
COMPANION_SUFFIXES = (".idx", ".lock", ".part")
T = TypeVar("T")

# Seconds and attempts of each request; remote_call bounds the whole call (CALL_BOUND).
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 30
ATTEMPTS = 2
RETRIES = 2
CALL_BOUND_ENV = "IMGPACK_REMOTE_TIMEOUT"
CALL_BOUND = 120.0  # seconds one remote call may go without progress
REMOTE_DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {
        "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "retries": {"max_attempts": ATTEMPTS, "mode": "standard"},
        },
    },
}
REMOTE_DEFAULTS["s3a"] = REMOTE_DEFAULTS["s3"]


class RemoteError(ImgpackError):
    """A remote dataset could not be read: the server failed, refused, or did not answer in time."""


class CacheError(ImgpackError):
    """The local part cache cannot hold or give back a copy (a full disk, permissions)."""


def call_bound() -> float:
    """Seconds a remote call may go without progress: ``$IMGPACK_REMOTE_TIMEOUT``, else 120."""
    raw = os.environ.get(CALL_BOUND_ENV, "").strip()
    if not raw:
        return CALL_BOUND
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise OptionError(f"{CALL_BOUND_ENV}={raw!r}: must be a positive number of seconds")
    return value


def _request_defaults(protocol: str) -> dict[str, Any]:
    """REMOTE_DEFAULTS for ``protocol``, each request's timeouts within a quarter of the call bound
    (so an abandoned call also ends soon)."""
    defaults = copy.deepcopy(REMOTE_DEFAULTS.get(protocol, {}))  # botocore rewrites its retries dict
    config = defaults.get("config_kwargs")
    if config is not None:
        quarter = call_bound() / 4
        config["connect_timeout"] = min(config["connect_timeout"], quarter)
        config["read_timeout"] = min(config["read_timeout"], quarter)
    return defaults


# Filesystems a forked process got from its parent. Their connections belong to an event loop
# running in a thread of the parent, which did not cross the fork. Finalized in the child (when
# it drops them, or when fsspec's own fork hook empties its instance cache there), s3fs closes
# them on the child's loop: every worker prints "Task exception was never retrieved ... attached
# to a different loop", and closing the connections takes their sockets out of the epoll set the
# child shares with the parent, so the parent's next request on a pooled connection waits for its
# read timeout (30 s). Held, they never are.
_INHERITED: list[Any] = []
_FORKING: list[Any] = []  # the cached filesystems at the moment of a fork, parent side


def keep_inherited(fs: Any) -> None:
    """Never let this process finalize ``fs``, a filesystem made before it was forked."""
    _INHERITED.append(fs)


def _cached_filesystems() -> list[Any]:
    import sys

    spec = sys.modules.get("fsspec.spec")  # never imported here: a process without fsspec has none
    if spec is None:
        return []
    found, classes = [], [spec.AbstractFileSystem]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        cache = cls.__dict__.get("_cache")
        if cache is not None and hasattr(cache, "values"):
            found.extend(cache.values())
    return found


def _before_fork() -> None:
    # Taken before the fork, not after it in the child: fsspec's own hook clears its cache in
    # the child, and it runs first wherever fsspec was imported before this module.
    _FORKING[:] = _cached_filesystems()


def _after_fork_in_parent() -> None:
    _FORKING.clear()


def _after_fork_in_child() -> None:
    _INHERITED.extend(_FORKING)
    _FORKING.clear()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


class Progress:
    """Touched by a streaming call (an upload's callback): its bound counts from the last touch."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def touch(self, *args: Any, **kwargs: Any) -> None:
        self.last = time.monotonic()


def bounded_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` with the timeout and retry defaults of the URL's protocol filled in."""
    options = dict(storage_options or {})
    protocol = url.split("://", 1)[0]
    for key, value in _request_defaults(protocol).items():
        if isinstance(value, dict):
            options[key] = {**value, **options.get(key, {})}
        else:
            options.setdefault(key, value)
    if protocol in ("http", "https") and "timeout" not in options.get("client_kwargs", {}):
        try:
            import aiohttp

            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
            options["client_kwargs"] = {**options.get("client_kwargs", {}), "timeout": timeout}
        except ImportError:
            pass
    return options


def remote_call(
    url: str, what: str, call: Callable[..., T], *args: Any, progress: Progress | None = None, **kwargs: Any
) -> T:
    """``call(*args, **kwargs)``, with any failure but a missing object turned into a RemoteError,
    and given up with one after ``call_bound()`` seconds without an answer (or, with ``progress``,
    since its last touch)."""
    bound = call_bound()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=run, name="imgpack-remote-call", daemon=True).start()
    while not done.wait(max(0.05, bound - (time.monotonic() - started))):
        started = max(started, progress.last) if progress is not None else started
        if time.monotonic() - started >= bound:
            raise RemoteError(
                f"{url}: {what}: no answer from the server for {bound:g} s; the server is stalled "
                f"or unreachable (check the URL and network; ${CALL_BOUND_ENV} sets this bound)"
            )
    ok, value = outcome[0]
    if ok:
        return value
    if isinstance(value, (FileNotFoundError, ImgpackError)) or not isinstance(value, Exception):
        raise value
    raise RemoteError(
        f"{url}: {what} failed ({type(value).__name__}: {value}); the server refused or did not "
        "answer within the timeouts (set storage_options, e.g. config_kwargs connect_timeout, "
        "read_timeout, retries for s3); check the URL, credentials and network"
    ) from None


def is_url(path: Any) -> TypeGuard[str]:
    return isinstance(path, str) and "://" in path


def join_url(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def url_fs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for ``url``."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ManifestError(f"{url}: reading URLs needs fsspec: pip install fsspec") from None
    options = bounded_options(url, storage_options)
    retries = options.pop("retries", RETRIES)  # s3fs's own retry loop, around botocore's attempts
    try:
        fs, path = url_to_fs(url, **options)
    except ImportError as exc:
        raise ManifestError(
            f"{url}: no fsspec backend for this URL ({exc}); install it, e.g. pip install s3fs"
        ) from None
    if hasattr(fs, "retries"):
        fs.retries = max(1, int(retries))
    _share_service_models(fs)
    return fs, path


# botocore's data loaders by data path: the parsed service models (S3's is ~1 MB of JSON), made
# by the first S3 session and inherited by forked DataLoader workers, whose own new sessions then
# skip the parsing (~60 ms of CPU per worker per epoch; tests/readers/remote/test_s3_sessions.py).
# The loader holds data only, no connection or event loop, so it may cross a fork.
_LOADERS: dict[Any, Any] = {}


def _share_service_models(fs: Any) -> None:
    """Give an s3fs filesystem not connected yet the session s3fs would make, with this
    process's botocore data loader (the parent's, in a forked worker)."""
    if not type(fs).__module__.startswith("s3fs") or getattr(fs, "session", True) is not None:
        return
    try:
        from aiobotocore.session import AioSession

        session = AioSession(**getattr(fs, "kwargs", {}))  # as s3fs.S3FileSystem.set_session makes it
        data_path = session.get_config_variable("data_path")
        loader = _LOADERS.setdefault(data_path, session.get_component("data_loader"))
        session.register_component("data_loader", loader)
    except Exception:  # noqa: BLE001 - s3fs then makes its own session, as without this
        return
    fs.session = session
    if hasattr(fs, "_session_is_owned"):
        fs._session_is_owned = True  # s3fs's to renew (refresh=True) like one it made itself


def read_url(url: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """The whole object at ``url``; FileNotFoundError if it does not exist."""
    fs, path = url_fs(url, storage_options)
    return remote_call(url, "reading", fs.cat_file, path)


def part_name(final: Path) -> Path:
    """The temporary name a download of ``final`` is written under: one per process and thread, so
    two threads of one reader never write (or rename away) each other's file."""
    return final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.part")


@contextlib.contextmanager
def held_lock(path: Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on the lock file at ``path``, the one the path names now.

    A lock file is unlinked by its holder when done and by ``ShardCache.clean`` when nobody holds
    it, so the file opened may no longer be the one at ``path`` once the lock is granted: two
    holders of different files would then download at once. Such a lock is dropped and taken again.
    """
    import fcntl

    while True:
        lock = open(path, "a+b")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _names_file(path, lock):
                yield path
                return
        finally:
            lock.close()


def _names_file(path: Path, opened: Any) -> bool:
    """Whether ``path`` still names the file ``opened`` (it may have been unlinked, and another
    made in its place, since it was opened)."""
    try:
        return os.stat(path).st_ino == os.fstat(opened.fileno()).st_ino
    except FileNotFoundError:
        return False


def remote_chunks(fs: Any, remote: str, url: str, what: str) -> Iterator[bytes]:
    """The object's bytes in DOWNLOAD_CHUNK pieces, each read a bounded remote call."""
    src = remote_call(url, what, fs.open, remote, "rb", block_size=DOWNLOAD_CHUNK)
    try:
        while chunk := remote_call(url, what, src.read, DOWNLOAD_CHUNK):
            yield chunk
    finally:
        src.close()


class ShardCache:
    """Whole shards downloaded once into ``cache_dir``, least recently used evicted past ``max_bytes``."""

    # (path, inode, mtime) of cached shards whose sha256 this process has checked.
    checked: set[tuple] = set()

    def __init__(self, cache_dir: str | os.PathLike, max_bytes: int | None = None):
        self.dir = Path(cache_dir).expanduser()
        self.max_bytes = max_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self.clean()

    def path(self, sha256: str, suffix: str = ".tar") -> Path:
        return self.dir / f"{sha256}{suffix}"

    def clean(self) -> None:
        """Remove ``.part`` files of dead downloads and ``.lock`` files nobody holds."""
        import fcntl

        for part in self.dir.glob(".*.part"):
            pid = part.name.rsplit(".", 3)[-3]  # .<name>.<pid>.<thread>.part
            if pid.isdigit() and pid_alive(int(pid)):
                continue
            part.unlink(missing_ok=True)
        for lock_path in self.dir.glob("*.lock"):
            try:
                with open(lock_path, "a+b") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if _names_file(lock_path, lock):  # not a newer lock a download holds
                        lock_path.unlink(missing_ok=True)
            except OSError:
                continue  # held by a download in progress

    def get(
        self,
        source: Callable[[], tuple[Any, str]],
        url: str,
        size: int | None,
        sha256: str,
        verify: bool = False,
        suffix: str = ".tar",
    ) -> Path:
        """Local copy of the part at ``url`` (fetched if absent), checked against size and sha256.
        ``source()``: (fsspec filesystem, the part's path in it), asked for only to download (a
        worker that finds its parts cached makes no session).

        A copy of the wrong size is always replaced; with ``verify`` the copy's sha256 is also
        checked once per process, and a corrupt copy replaced. ``size`` None: not recorded.
        """
        final = self.path(sha256, suffix)
        if self._usable(final, size, sha256, verify):
            return final
        with held_lock(self.dir / f"{sha256}.lock") as lock_path:
            if not self._usable(final, size, sha256, verify):  # another worker may have fetched it
                self._download(*source(), url, final, size, sha256)
            lock_path.unlink(missing_ok=True)  # while held: a waiter finds it gone and locks anew
        self.evict(keep=final)
        return final

    def index(
        self, source: Callable[[], tuple[Any, str]], url: str, sha256: str, check: Callable[[str, str], T]
    ) -> T:
        """``check(text, where)`` of the shard's ``.idx``: the cached copy, or when it is missing or
        fails ``check`` (a damaged cache file), the remote one (``source()`` as for ``get``),
        cached once it passes."""
        cached = self.dir / f"{sha256}.idx"
        try:
            return check(cached.read_text(encoding="ascii"), str(cached))
        except FileNotFoundError:
            pass
        except (UnicodeDecodeError, ManifestError, ChecksumError) as exc:
            warn(f"{cached}: cached index is damaged ({exc}); fetching {url} again")
            cached.unlink(missing_ok=True)
        except OSError as exc:
            raise self.unusable(cached, url, exc) from None
        fs, remote_index = source()
        text = remote_call(url, "reading the index", fs.cat_file, remote_index).decode("ascii", "replace")
        result = check(text, url)
        tmp = part_name(cached)
        try:
            tmp.write_text(text, encoding="ascii", errors="replace")
            os.replace(tmp, cached)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self.unusable(cached, url, exc) from None
        return result

    def unusable(self, path: Path, url: str, exc: OSError) -> CacheError:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        cause = "the cache's disk is full" if full else f"{exc.strerror or exc}"
        return CacheError(
            f"{path}: cannot write or read this cached copy of {url} ({cause}); free space in "
            f"{self.dir} or choose another cache_dir (cache_size bounds what it keeps)"
        )

    def _usable(self, path: Path, size: int | None, sha256: str, verify: bool) -> bool:
        try:
            st = path.stat()
            if size is not None and st.st_size != size:
                return False
            key = (str(path), st.st_ino, st.st_mtime_ns)
            if verify and key not in self.checked:
                if file_sha256(path) != sha256:
                    path.unlink(missing_ok=True)  # corrupt copy: download it again
                    return False
                self.checked.add(key)
            os.utime(path)  # mark as recently used
            return True
        except FileNotFoundError:
            return False

    def _download(self, fs: Any, remote: str, url: str, final: Path, size: int | None, sha256: str) -> None:
        tmp = part_name(final)
        digest = hashlib.sha256()
        got = 0

        try:
            try:
                dst = open(tmp, "wb")
            except OSError as exc:
                raise self.unusable(tmp, url, exc) from None
            with dst:
                for chunk in remote_chunks(fs, remote, url, "downloading"):
                    digest.update(chunk)
                    try:
                        dst.write(chunk)
                    except OSError as exc:
                        raise self.unusable(tmp, url, exc) from None
                    got += len(chunk)
            check_against_manifest(url, digest.hexdigest(), sha256, got, size, REMOTE_FIX)
            os.replace(tmp, final)
            self.checked.add((str(final), final.stat().st_ino, final.stat().st_mtime_ns))
        finally:
            tmp.unlink(missing_ok=True)

    def evict(self, keep: Path | None = None) -> None:
        if self.max_bytes is None:
            return
        entries = []
        for path in self.dir.iterdir():
            if path.name.startswith(".") or path.suffix in COMPANION_SUFFIXES:
                continue
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
            path.with_suffix(".idx").unlink(missing_ok=True)
            total -= size
