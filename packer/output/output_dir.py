"""The output directory of a pack: what is ours, who may write it, and how it is replaced.

- Ownership: ``--force`` and a restarted ``--resume`` delete only entries imgpack writes (our
  manifest, the progress file, what each registered format declares); anything else is refused.
- Lock: ``flock(LOCK_EX | LOCK_NB)`` on the output directory for the whole run: a second pack
  into the same output fails at once instead of interleaving writes.
- Replacement: ``--force`` over a complete dataset builds the new one in ``.<name>.imgpack-new``
  and swaps it in with one ``renameat2(RENAME_EXCHANGE)``: the path always holds one whole
  dataset, open readers keep the old inodes, the old tree is deleted after the swap.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from readers.errors import ImgpackError
from readers.formats.registry import registered
from readers.store.manifest import MANIFEST_NAME, PROGRESS_NAME
from readers.store.sample_hashes import is_hashes_name
from readers.store.sample_sources import SOURCE_PATHS_NAME

if TYPE_CHECKING:
    from readers.formats.writer_base import FormatWriter, PartResult
    from readers.store.manifest import Shard

try:
    import fcntl
    HAVE_FLOCK = True
except ImportError:  # Windows: no flock, packs are not serialised
    HAVE_FLOCK = False

STAGING_SUFFIX = ".imgpack-new"
WRITE_TEST = ".imgpack-write-test"
RAY_STAGING = ".ray-staging"  # parts Ray tasks are writing (packer/engine/_ray_engine.py)
STAGING_FOLDERS = (".staging", RAY_STAGING)  # parts in the making (BMP parts, Ray runs)
TEMPORARY = re.compile(r"\.(?P<name>.+?)\.(\d+\.)?tmp")  # an atomic write in progress: .<name>[.<pid>].tmp
SEALED = (MANIFEST_NAME, PROGRESS_NAME.lstrip("."))  # imgpack's own files that are written atomically
# A sidecar of dataset version N (packer/edit/append.py): ``labels.i64`` -> ``labels~v2.i64``.
VERSIONED = re.compile(r"(?P<stem>[^.~/]+)~v(?P<version>[1-9]\d*)(?P<suffix>\..*)?")


def versioned(name: str, version: int) -> str:
    """The name of sidecar ``name`` (of any version) for dataset version ``version``."""
    stem, dot, suffix = unversioned(name).partition(".")
    return f"{stem}~v{version}{dot}{suffix}"


def unversioned(name: str) -> str:
    """``labels~v2.i64`` -> ``labels.i64``; other names unchanged."""
    match = VERSIONED.fullmatch(name)
    return f"{match['stem']}{match['suffix'] or ''}" if match else name


class Output(Protocol):
    """Where a pack's parts go, and how the finished dataset lands: ``LocalOutput`` below, or
    packer/output/remote_output.py's ``RemoteOutput`` for a URL. The engines see only this."""

    remote: bool

    @property
    def location(self) -> str:
        """The output as the user named it (a folder, or a URL)."""
        ...

    def part_done(self, writer: FormatWriter, result: PartResult) -> PartResult:
        """A part was written below ``writer.out``: take it (upload it), return what to record."""
        ...

    def part_intact(self, writer: FormatWriter, result: PartResult) -> bool:
        """Whether a part recorded as done is still whole (checked on --resume)."""
        ...

    def drop_part(self, writer: FormatWriter, result: PartResult) -> None:
        """Delete a written part that the pack's cut no longer has (packer/engine/_part_plan.py)."""
        ...

    def saved(self, work: Path) -> None:
        """The progress file in ``work`` was rewritten."""
        ...

    def finish(
        self, writer: FormatWriter, results: list[PartResult], classes: list[str]
    ) -> tuple[list[Shard], dict[str, Any]]:
        """The final shards (global ``first``) and the format's manifest ``extra``."""
        ...

    def commit(self, work: Path) -> None:
        """The manifest is written in ``work``: make the dataset the output's, atomically."""
        ...

    def discard(self, work: Path) -> None:
        """Remove what this pack wrote (nothing worth resuming: every image was skipped)."""
        ...


class LocalOutput:
    """A local folder: parts stay where they are written, the finished dataset is swapped in."""

    remote = False

    def __init__(self, out: Path):
        self.out = out

    @property
    def location(self) -> str:
        return str(self.out)

    def part_done(self, writer: FormatWriter, result: PartResult) -> PartResult:
        return result

    def part_intact(self, writer: FormatWriter, result: PartResult) -> bool:
        return writer.part_intact(result)

    def drop_part(self, writer: FormatWriter, result: PartResult) -> None:
        remove_part_files(writer, result.part)

    def saved(self, work: Path) -> None:
        pass

    def finish(
        self, writer: FormatWriter, results: list[PartResult], classes: list[str]
    ) -> tuple[list[Shard], dict[str, Any]]:
        return writer.finish(results, classes)

    def commit(self, work: Path) -> None:
        replace_output(work, self.out)

    def discard(self, work: Path) -> None:
        clear_ours(work, "remove")  # a staging sibling goes, ``out`` stays as it was
        if work != self.out:
            work.rmdir()


def remove_part_files(writer: FormatWriter, part: int) -> None:
    """Delete the files of ``part`` below ``writer.out`` (what a part left, whole or not)."""
    for path in writer.part_files(part + writer.part_base):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def staging_dir(out: Path) -> Path:
    return out.parent / f".{out.name}{STAGING_SUFFIX}"


def check_not_source(src: str | Path, out: Path) -> None:
    """Refuse an output that is the source, inside it, or one of its parents."""
    src_real, out_real = Path(os.path.realpath(src)), Path(os.path.realpath(out))
    if out_real == src_real or src_real in out_real.parents or out_real in src_real.parents:
        where = (
            "is" if out_real == src_real else ("is inside" if src_real in out_real.parents else "contains")
        )
        raise ImgpackError(
            f"{out}: the output {where} the source folder {src}; choose an -o outside the source tree"
        )


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


MANIFEST_TYPES = {
    "format": str,
    "format_version": int,
    "num_samples": int,
    "classes": list,
    "imgpack_version": str,
    "shards": list,
}
PROGRESS_TYPES = {"fingerprint": str, "parts": list}


def _typed(data: object, types: Mapping[str, type]) -> TypeGuard[dict[str, Any]]:
    return isinstance(data, dict) and all(isinstance(data.get(k), t) for k, t in types.items())


def is_our_manifest(path: Path) -> bool:
    """True when ``path`` parses as a manifest imgpack wrote (its fields and their types)."""
    return manifest_is_ours(_read_json(path))


def manifest_is_ours(data: object) -> bool:
    return _typed(data, MANIFEST_TYPES) and all(
        isinstance(s, dict) and "file" in s and "sha256" in s for s in data["shards"]
    )


def is_our_progress(path: Path) -> bool:
    return progress_is_ours(_read_json(path))


def progress_is_ours(data: object) -> bool:
    return _typed(data, PROGRESS_TYPES)


def dataset_format(read_json: Callable[[str], object]) -> str | None:
    """The format the output's manifest names, when it parses as ours (else None)."""
    data = read_json(MANIFEST_NAME)
    return data["format"] if isinstance(data, dict) and manifest_is_ours(data) else None


def owned(
    name: str, below: Sequence[str] | None, read_json: Callable[[str], object], dataset: str | None = None
) -> bool:
    """Whether the top-level output entry ``name`` is one imgpack writes: a file (``below`` None)
    or a folder holding the files ``below``. The formats in the registry say which data files and
    folders are theirs (some files only in an output whose manifest names them: ``dataset``, from
    ``dataset_format``); the manifest and progress file count when they parse as ours
    (``read_json(name)``). The same rules hold for a local folder and a bucket."""
    if below is not None:
        return name in STAGING_FOLDERS or any(f.owns(name, below) for f in registered().values())
    if name == MANIFEST_NAME:
        return manifest_is_ours(read_json(name))
    if name == PROGRESS_NAME:
        return progress_is_ours(read_json(name))
    fmt = registered().get(dataset) if dataset is not None else None
    return owned_file(name) or (fmt is not None and fmt.owns(name, in_dataset=True))


def owned_file(name: str) -> bool:
    """Whether ``name`` is a data file of a registered format, imgpack's write probe or source
    path list, or a temporary of one of them or of the manifest or progress file."""
    if name in (WRITE_TEST, SOURCE_PATHS_NAME) or is_hashes_name(name):
        return True
    if unversioned(name) != name:  # an appended dataset's sidecar: ours when its first version is
        return owned_file(unversioned(name))
    temporary = TEMPORARY.fullmatch(name)
    if temporary and (temporary["name"] in SEALED or owned_file(temporary["name"])):
        return True
    return any(f.owns(name) for f in registered().values())


def _files_below(folder: str) -> list[str]:
    walk = os.walk(folder)
    return [os.path.relpath(os.path.join(top, name), folder) for top, _, files in walk for name in files]


def _is_ours(folder: Path, entry: os.DirEntry, dataset: str | None) -> bool:
    if entry.is_symlink():
        return False
    below = _files_below(entry.path) if entry.is_dir() else None
    return owned(entry.name, below, lambda name: _read_json(folder / name), dataset)


def foreign_entries(folder: Path) -> list[str]:
    """Names in ``folder`` that imgpack did not write (sorted)."""
    dataset = dataset_format(lambda name: _read_json(folder / name))
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if not _is_ours(folder, e, dataset))


def refuse_foreign(folder: Path, action: str) -> None:
    """Raise, naming them, when ``folder`` holds entries imgpack did not write."""
    foreign = foreign_entries(folder)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ImgpackError(
            f"{folder}: is not an imgpack output (it holds {shown}); refusing to {action} it. "
            "Choose another -o, or move those files away"
        )


def clear_ours(folder: Path, action: str) -> None:
    """Empty ``folder`` (kept, so a lock on it stays valid) when everything in it is ours."""
    refuse_foreign(folder, action)
    with os.scandir(folder) as entries:
        for entry in list(entries):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def remove_temporaries(folder: Path) -> None:
    """Drop temp files a killed pack left (unfinished atomic writes, a dead Ray run's parts)."""
    if (folder / RAY_STAGING).is_dir():  # a finished part was moved out of it
        shutil.rmtree(folder / RAY_STAGING, ignore_errors=True)
    with os.scandir(folder) as entries:
        for entry in list(entries):
            if TEMPORARY.fullmatch(entry.name) and owned_file(entry.name) and entry.is_file():
                os.unlink(entry.path)


def has_entries(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(True for _ in entries)


def open_output(out: Path, force: bool, resume: bool) -> tuple[Path, OutputLock]:
    """Lock ``out`` and pick the directory to write into (``out``, or a staging sibling)."""
    if out.exists() and not out.is_dir():
        raise ImgpackError(f"{out}: exists and is not a directory; choose another -o")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImgpackError(f"{out}: cannot write here ({exc.strerror}); choose a writable -o") from None
    lock = OutputLock(out)
    try:
        work = _work_dir(out, force, resume)
        probe = work / WRITE_TEST
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        lock.release()
        raise ImgpackError(f"{out}: cannot write here ({exc.strerror}); choose a writable -o") from None
    except BaseException:
        lock.release()
        raise
    return work, lock


def _work_dir(out: Path, force: bool, resume: bool) -> Path:
    staging = staging_dir(out)
    if is_our_manifest(out / MANIFEST_NAME):  # a complete dataset: replaced only by a swap
        if resume and staging.is_dir() and (staging / PROGRESS_NAME).exists():
            return staging
        if resume:
            raise ImgpackError(f"{out}: already complete (has {MANIFEST_NAME}); nothing to resume")
        if not force:
            raise ImgpackError(f"{out}: already exists; pass --force to replace it")
        refuse_foreign(out, "replace")
        if staging.exists():
            clear_ours(staging, "replace")
        staging.mkdir(exist_ok=True)
        return staging
    if not has_entries(out):
        return out
    interrupted = is_our_progress(out / PROGRESS_NAME)
    if resume and interrupted:
        return out
    if not (force or resume):
        refuse_foreign(out, "write into")
        hint = "re-run with --resume to finish it, or " if interrupted else ""
        raise ImgpackError(f"{out}: already exists; {hint}pass --force to replace it")
    clear_ours(out, "replace" if force else "resume into")  # --resume before any progress: start over
    return out


def replace_output(work: Path, out: Path) -> None:
    """Swap the finished staging directory into ``out`` and delete the old dataset."""
    if work != out:
        exchange(work, out)
    (out / PROGRESS_NAME).unlink(missing_ok=True)
    if work != out:
        shutil.rmtree(work)


class OutputLock:
    """An exclusive, non-blocking flock on the output directory, held for the whole pack."""

    def __init__(self, folder: Path):
        self.fd = -1
        if not HAVE_FLOCK:  # no flock on this platform: packs are not serialised
            return
        self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise ImgpackError(
                f"{folder}: another pack is writing this output right now; wait for it to finish "
                "(or stop it) before packing here again"
            ) from None
        except OSError:  # a filesystem without locks (ENOLCK on some network mounts): unlocked
            self.release()

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = -1


RENAME_EXCHANGE = 2
AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Swap two directory entries in one step (Linux renameat2); two renames elsewhere."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS):  # EINVAL: the filesystem cannot exchange
            raise OSError(code, os.strerror(code), str(a))
    aside = a.with_name(a.name + ".old")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)
