"""A pack's output at an fsspec URL (``s3://bucket/train.tar``, ``gs://...``, ``file://...``).

Every part is written to a local staging folder (``$TMPDIR/imgpack-upload-<hash of the URL>``,
locked against a second pack on this machine), uploaded when it is complete, and its local
copy dropped; the progress file is uploaded after every part, the manifest last. What a part
uploaded is recorded with it (object name -> size and the store's ETag), so ``--resume`` trusts
a part only when every one of its objects is present with the recorded size and ETag; anything
else is packed and uploaded again. With ``--engine ray`` each task writes its part in a
temporary folder on its own node and uploads it itself (``part_done``).

``finish`` is what the format's registry entry says (``Format.remote_finish``): "rename" formats
(tar, tfrecord) rename their part files to shard names on the server (copy + delete, no
download); "as-is" ones (LMDB) have nothing to do; "local" ones rewrite their files (HDF5 stores
the manifest in each file, BMP renames every image), so their parts are downloaded into the
staging folder, finished there and uploaded again.

``--force`` deletes only objects imgpack recognises as its own (the rules of packer/output/output_dir.py);
unlike a local output, a replaced remote dataset is not swapped in atomically: the old manifest
goes first, so readers see "no dataset" rather than a mixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packer.output.output_dir import (
    OutputLock,
    dataset_format,
    manifest_is_ours,
    owned,
    progress_is_ours,
    remove_part_files,
)
from readers.errors import ImgpackError
from readers.formats.format import Format
from readers.formats.registry import registered
from readers.formats.writer_base import FormatWriter, PartResult
from readers.remote.urls import Progress, RemoteError, remote_call, url_fs
from readers.store.manifest import MANIFEST_NAME, PROGRESS_NAME, Shard
from readers.store.sample_hashes import is_hashes_name
from readers.store.sample_sources import SOURCE_PATHS_NAME

IO_THREADS = 8  # uploads, copies, downloads in flight at once
UPLOADED = "uploaded"  # PartResult.extra key: {object name: {"size": n, "etag": ...}}


def staging_folder(url: str) -> Path:
    """The local folder where parts for ``url`` are written before they are uploaded."""
    tag = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"imgpack-upload-{tag}"


def _etag(info: dict[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "checksum"):
        if info.get(key):
            return str(info[key])
    return None


class RemoteOutput:
    """Uploads, resume checks and the finish of a pack whose output is ``url``; picklable (Ray)."""

    remote = True

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.storage_options = storage_options
        self._fs: Any = None
        self._root = ""
        self._listing: dict[str, dict[str, Any]] | None = None

    @property
    def location(self) -> str:
        return self.url

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_listing": None}

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, root = url_fs(self.url, self.storage_options)
            self._root = root.rstrip("/")
        return self._fs

    def path(self, name: str) -> str:
        self.fs  # noqa: B018 - sets _root
        return f"{self._root}/{name}"

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return remote_call(self.url, what, fn, *args, **kwargs)

    def listing(self, fresh: bool = False) -> dict[str, dict[str, Any]]:
        """Every object below the output: name relative to it -> fsspec info."""
        if self._listing is None or fresh:
            self.fs.invalidate_cache()  # fsspec caches listings; what this process uploaded is not in them
            found = self.call("listing the output", self.fs.find, self.path(""), detail=True)
            cut = len(self.path(""))
            self._listing = {p[cut:]: info for p, info in found.items() if info.get("type") != "directory"}
        return self._listing

    def read_json(self, name: str) -> object:
        try:
            return json.loads(self.call(f"reading {name}", self.fs.cat_file, self.path(name)))
        except (FileNotFoundError, ValueError):
            return None

    # -- opening: --force / --resume on what the output holds -------------------------------
    def open(self, force: bool, resume: bool) -> tuple[Path, OutputLock]:
        """Check the output's state, lock and empty the local staging folder; the folder to write into.

        On ``resume`` of an interrupted pack, its progress file is put into the staging folder."""
        staging = staging_folder(self.url)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            lock = OutputLock(staging)
        except ImgpackError:
            raise ImgpackError(
                f"{self.url}: another pack on this machine is writing this output right now; wait for "
                "it to finish (or stop it) before packing here again"
            ) from None
        try:
            for entry in list(staging.iterdir()):  # what a killed run on this machine left
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            if self._prepare(force, resume):
                self.call("downloading the progress file", self.fs.get_file, self.path(PROGRESS_NAME),
                          str(staging / PROGRESS_NAME))  # fmt: skip
        except BaseException:
            lock.release()
            raise
        return staging, lock

    def _prepare(self, force: bool, resume: bool) -> bool:
        """Clear or keep what the output holds; True when an interrupted pack is to be resumed."""
        listing = self.listing(fresh=True)
        if not listing:
            return False
        if MANIFEST_NAME in listing and manifest_is_ours(self.read_json(MANIFEST_NAME)):
            if resume:
                raise ImgpackError(f"{self.url}: already complete (has {MANIFEST_NAME}); nothing to resume")
            if not force:
                raise ImgpackError(f"{self.url}: already exists; pass --force to replace it")
            self.clear("replace")
            return False
        interrupted = PROGRESS_NAME in listing and progress_is_ours(self.read_json(PROGRESS_NAME))
        if resume and interrupted:
            return True
        if not (force or resume):
            self.refuse_foreign("write into")
            hint = "re-run with --resume to finish it, or " if interrupted else ""
            raise ImgpackError(f"{self.url}: already exists; {hint}pass --force to replace it")
        self.clear("replace" if force else "resume into")
        return False

    def foreign(self) -> list[str]:
        """Top-level names below the output that imgpack did not write (sorted)."""
        below: dict[str, list[str]] = {}
        for name in self.listing():
            top, _, rest = name.partition("/")
            below.setdefault(top, []).append(rest)
        dataset = dataset_format(self.read_json) if MANIFEST_NAME in below else None
        return sorted(top for top, rests in below.items() if not self._is_ours(top, rests, dataset))

    def _is_ours(self, top: str, rests: list[str], dataset: str | None) -> bool:
        rest = None if rests == [""] else rests  # rests: a folder's files
        return owned(top, rest, self.read_json, dataset)

    def refuse_foreign(self, action: str) -> None:
        foreign = self.foreign()
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise ImgpackError(
                f"{self.url}: is not an imgpack output (it holds {shown}); refusing to {action} it. "
                "Choose another -o, or move those objects away"
            )

    def clear(self, action: str) -> None:
        """Delete every object below the output (the manifest first) when all of them are ours."""
        self.refuse_foreign(action)
        names = list(self.listing())
        if MANIFEST_NAME in names:  # first, on its own: from now on readers see no dataset
            self.delete([MANIFEST_NAME])
        self.delete([n for n in names if n != MANIFEST_NAME])
        self._listing = {}

    def discard(self, work: Path) -> None:
        """Remove what this pack uploaded (its progress file, parts): nothing is left to resume."""
        self.clear("remove")

    def delete(self, names: list[str]) -> None:
        """Delete objects (named relative to the output) in bulk requests."""
        if names:
            self.call("deleting", self.fs.rm, [self.path(n) for n in names])

    # -- parts --------------------------------------------------------------------------------
    def part_done(self, writer: FormatWriter, result: PartResult) -> PartResult:
        """Upload a finished part's files (written below ``writer.out``), drop the local copies,
        and record each object's size and ETag with the part."""
        local = self.part_local_files(writer, result.part)
        names = [f.relative_to(writer.out).as_posix() for f in local]
        self.upload(local, names)
        result.extra[UPLOADED] = self.stamps(names, {n: f.stat().st_size for n, f in zip(names, local)})
        remove_part_files(writer, result.part)
        return result

    def drop_part(self, writer: FormatWriter, result: PartResult) -> None:
        """Delete the objects a part uploaded (and any local copy of it)."""
        self.delete(sorted(result.extra.get(UPLOADED, {})))
        self._listing = None
        remove_part_files(writer, result.part)

    @staticmethod
    def part_local_files(writer: FormatWriter, part: int) -> list[Path]:
        files: list[Path] = []
        for path in writer.part_files(part + writer.part_base):
            files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return files

    def upload(self, local: list[Path], names: list[str]) -> None:
        jobs = [(str(f), self.path(n)) for f, n in zip(local, names)]
        self.each("uploading", self.put_file, jobs, bounded=True)

    def put_file(self, local: str, remote: str) -> None:
        """One upload, bounded from its last uploaded chunk (a large part may take long)."""
        from fsspec.callbacks import Callback

        progress = Progress()
        callback = Callback(hooks={"progress": progress.touch})
        put = self.fs.put_file
        remote_call(self.url, "uploading", put, local, remote, callback=callback, progress=progress)

    def each(self, what: str, fn: Any, jobs: list[tuple], bounded: bool = False) -> None:
        """``fn(*job)`` for every job, ``IO_THREADS`` at a time (one request each, no listing);
        ``bounded``: ``fn`` makes its own bounded remote calls."""

        def run(job: tuple) -> None:
            fn(*job) if bounded else self.call(what, fn, *job)

        if len(jobs) <= 1:
            for job in jobs:
                run(job)
            return
        with ThreadPoolExecutor(min(IO_THREADS, len(jobs))) as pool:
            list(pool.map(run, jobs))

    def stamps(self, names: list[str], sizes: dict[str, int]) -> dict[str, dict[str, Any]]:
        """Size and ETag of each uploaded object, checked against the local size."""
        out = {}
        for name in names:
            info = self.call("checking an upload", self.fs.info, self.path(name))
            if int(info["size"]) != sizes[name]:
                raise RemoteError(
                    f"{self.url}/{name}: the store holds {info['size']} bytes after uploading "
                    f"{sizes[name]}; re-run with --resume"
                )
            out[name] = {"size": sizes[name], "etag": _etag(info)}
        return out

    def part_intact(self, writer: FormatWriter, result: PartResult) -> bool:
        """A part recorded as done counts only when each object it uploaded is there, unchanged."""
        uploaded = result.extra.get(UPLOADED)
        if not uploaded:
            return False
        listing = self.listing()
        for name, stamp in uploaded.items():
            info = listing.get(name)
            if info is None or int(info["size"]) != stamp["size"]:
                return False
            if stamp.get("etag") is not None and _etag(info) != stamp["etag"]:
                return False
        return True

    def saved(self, work: Path) -> None:
        """The progress file was rewritten locally: upload it."""
        self.upload([work / PROGRESS_NAME], [PROGRESS_NAME])

    # -- the end ------------------------------------------------------------------------------
    def finish(
        self, writer: FormatWriter, results: list[PartResult], classes: list[str]
    ) -> tuple[list[Shard], dict[str, Any]]:
        how = writer.format.remote_finish
        if how in ("rename", "as-is"):  # files a finish writes go straight to the store

            def write_file(name: str, data: bytes) -> None:
                self.call("uploading", self.fs.pipe_file, self.path(name), data)
                self._listing = None  # listed afresh next time (a discard must see this object)

            writer.write_file = write_file  # type: ignore[method-assign]
        if how == "rename":
            listing = self.listing(fresh=True)
            planned: list[tuple[str, str] | None] = []

            def move(src: str | Path, dst: str | Path) -> None:
                planned.append(self.planned_move(listing, src, dst))

            writer.move = move  # type: ignore[attr-defined]  # the "rename" formats are RollingWriters
            placed = writer.finish(results, classes)
            moves = [m for m in planned if m is not None]
            self.each("renaming", self.fs.cp_file, [(self.path(a), self.path(b)) for a, b in moves])
            self.delete([src for src, _ in moves])
            return placed
        if how == "as-is":
            return writer.finish(results, classes)
        uploaded = [name for r in results for name in r.extra[UPLOADED]]
        for name in uploaded:
            (writer.out / name).parent.mkdir(parents=True, exist_ok=True)
        self.each(
            "downloading parts", self.fs.get_file, [(self.path(n), str(writer.out / n)) for n in uploaded]
        )
        shards, extra = writer.finish(results, classes)
        local = sorted(
            p
            for p in writer.out.rglob("*")
            if p.is_file() and p.name != PROGRESS_NAME and not p.name.endswith(".tmp")
        )
        names = [p.relative_to(writer.out).as_posix() for p in local]
        self.upload(local, names)
        self.delete(sorted(set(uploaded) - set(names)))  # staged files that were renamed
        return shards, extra

    def planned_move(
        self, listing: dict[str, Any], src: str | Path, dst: str | Path
    ) -> tuple[str, str] | None:
        """The server-side copy (then delete) that renames ``src`` to ``dst``; None when an
        earlier, interrupted finish did it already."""
        src, dst = str(src), str(dst)  # rolling formats name index files with a Path
        if src in listing:
            return src, dst
        if dst not in listing:
            raise ImgpackError(
                f"{self.url}/{src}: part file vanished before the pack finished; re-run with --force"
            )
        return None

    def commit(self, work: Path) -> None:
        """Upload the manifest (written in ``work``), last; drop the progress file and staging."""
        if (work / SOURCE_PATHS_NAME).exists():  # the formats finished "as-is" or by renames left it here
            self.upload([work / SOURCE_PATHS_NAME], [SOURCE_PATHS_NAME])
        hashes = [p.name for p in work.iterdir() if p.is_file() and is_hashes_name(p.name)]
        self.upload([work / name for name in hashes], hashes)  # the hash sidecar, as the paths
        self.upload([work / MANIFEST_NAME], [MANIFEST_NAME])
        self.delete([PROGRESS_NAME])
        shutil.rmtree(work)  # the lock on it goes with the pack's end


def check_remote_format(fmt: Format, url: str) -> None:
    if fmt.remote_finish is None:
        can = ", ".join(name for name, f in registered().items() if f.remote_finish is not None)
        raise ImgpackError(
            f"{url}: --to {fmt.name} cannot be written to a URL yet (it can: {can}); "
            "pack to a local folder and upload it"
        )


def same_place(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two URLs (or a URL and a path) name the same tree or one inside the other."""
    a, b = str(a).rstrip("/") + "/", str(b).rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)
