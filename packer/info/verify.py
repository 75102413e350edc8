"""``pack verify``: re-check every shard checksum and decode every record, in parallel.

The work is cut into units, every part's checksum first (and the label file's, whose labels must
also be the records'), then blocks of records, and run on
``workers`` processes (each with its own reader). Results are taken in unit order and the same
stopping rules apply as one process would (stop reading records after a structural error or
``MAX_PROBLEMS``), so the report is the same for any number of workers.

A dataset behind a URL is checked through the part cache (``cache_dir``, or a temporary one):
each part is downloaded once, checked against the manifest, and its records read from there.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from readers.errors import ChecksumError, ImgpackError
from readers.formats import FormatReader, open_reader
from readers.image.decode import decode_record
from readers.remote.urls import ShardCache, is_url
from readers.store.manifest import read_manifest
from readers.store.sample_hashes import stored_hashes


@dataclass
class VerifyReport:
    path: str
    samples: int
    shards: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


MAX_PROBLEMS = 100  # enough to see the pattern; a corrupt count must not make the report endless
DEFAULT_WORKERS = 4

# Sets of file identities whose sha256 a process has checked (FormatReader._sha_checked and the
# remote cache's): handed from the checksum units to the record units, so no worker hashes a part
# again that another one has just checked.
Checked = tuple[frozenset, frozenset]

_reader: FormatReader | None = None  # this process's reader (set by _start_worker)


def default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(DEFAULT_WORKERS, cpus))


def _start_worker(path: str, options: dict[str, Any]) -> None:
    global _reader
    _reader = open_reader(path, verify=True, **options)


def _start_pool_worker(path: str, options: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    _start_worker(path, options)


def _check_part(position: int) -> tuple[list[str], Checked]:
    """Problems with part ``position``'s checksum (downloaded first if remote)."""
    reader = _reader
    assert reader is not None
    owner, shard = reader.checked_parts()[position]  # a view's: its parent's
    problems = []
    try:
        if owner.remote:
            owner.local_file(shard)  # downloaded, size and sha256 checked against the manifest
        else:
            data_file = owner.checksum_path(shard)
            if not Path(data_file).exists():
                problems.append(f"{data_file}: missing")
            else:
                owner.check_sha256(data_file, shard.sha256, str(data_file))
    except ImgpackError as exc:
        problems.append(str(exc))
    return problems, (frozenset(reader._sha_checked), frozenset(ShardCache.checked))


def _check_block(start: int, stop: int, decode: bool, checked: Checked) -> tuple[list[str], bool]:
    """(problems, structural) for records [start, stop); ``structural``: reading on is pointless."""
    reader = _reader
    assert reader is not None
    reader._sha_checked |= checked[0]
    ShardCache.checked |= checked[1]
    try:
        records = reader.read_block(start, stop)
    except ChecksumError as exc:
        return [str(exc)], False
    except ImgpackError as exc:  # the structure is broken: reading on would repeat it
        return [str(exc)], True
    problems = []
    for index, record in enumerate(records, start):
        if decode:
            try:
                decode_record(record, "numpy")
            except Exception as exc:  # noqa: BLE001 - report, keep checking the rest
                problems.append(f"{reader.describe(index)} does not decode ({exc})")
    return problems, False


def _check_labels() -> list[str]:
    """Problems with the label file (its size, sha256 and values), where the format keeps one,
    and with the hash sidecar."""
    reader = _reader
    assert reader is not None
    try:
        reader.stored_labels()
        stored_hashes(reader)  # the hash sidecar's size and sha256 (readers/store/sample_hashes.py)
    except ImgpackError as exc:
        return [str(exc)]
    return []


class _Runner:
    """Runs units in this process (one worker) or on a process pool, results in submission order."""

    def __init__(self, workers: int, path: str, options: dict[str, Any]):
        self.pool: ProcessPoolExecutor | None = None
        if workers > 1:
            method = "fork" if "fork" in _start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(
                workers,
                mp_context=get_context(method),
                initializer=_start_pool_worker,
                initargs=(path, options),
            )
        self.window = max(1, workers) * 4

    def ordered(self, calls: list[tuple[Callable, tuple]]) -> Generator[Any, None, None]:
        """Each call's result in order; on an early stop (generator closed) the rest is cancelled."""
        if self.pool is None:
            for fn, args in calls:
                yield fn(*args)
            return
        pending: deque[Future] = deque()
        todo = iter(calls)
        try:
            for fn, args in todo:
                pending.append(self.pool.submit(fn, *args))
                if len(pending) >= self.window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()

    def close(self, abort: bool = False) -> None:
        """Stop the pool; ``abort`` (interrupted, failed): kill the workers rather than wait."""
        if self.pool is None:
            return
        if abort:
            for process in list((self.pool._processes or {}).values()):
                process.kill()
        self.pool.shutdown(wait=not abort, cancel_futures=True)


def _start_methods() -> list[str]:
    from multiprocessing import get_all_start_methods

    return get_all_start_methods()


def verify_dataset(
    path: str | os.PathLike,
    decode: bool = True,
    block: int = 256,
    workers: int = 1,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Check every part's checksum, then read (and with ``decode``, decode) every record.

    ``path`` may be an fsspec URL; its parts are downloaded once into ``cache_dir`` (a
    temporary directory, removed afterwards, when None). ``progress`` shows a tqdm bar.
    """
    path = str(path)
    if not is_url(path):
        return _verify(path, {}, decode, block, workers, progress)
    options: dict[str, Any] = {"storage_options": storage_options or {}}
    if cache_dir is not None:
        return _verify(path, {**options, "cache_dir": str(cache_dir)}, decode, block, workers, progress)
    with tempfile.TemporaryDirectory(prefix="imgpack-verify-") as tmp:
        return _verify(path, {**options, "cache_dir": tmp}, decode, block, workers, progress)


def _listed_counts(path: str, options: dict[str, Any]) -> tuple[int, int]:
    """(samples, parts) the manifest lists, for a report on a dataset whose parts do not open."""
    try:
        manifest = read_manifest(path, options.get("storage_options"))
    except ImgpackError:
        return 0, 0
    return manifest.num_samples, len(manifest.shards)


def _verify(
    path: str, options: dict[str, Any], decode: bool, block: int, workers: int, progress: bool
) -> VerifyReport:
    global _reader
    try:
        _start_worker(path, options)  # checks the manifest schema and (local) every part's counts
    except ImgpackError as exc:
        return VerifyReport(path, *_listed_counts(path, options), [str(exc)])
    assert _reader is not None
    manifest = _reader.manifest
    parts = len(_reader.checked_parts())
    report = VerifyReport(path, manifest.num_samples, parts)
    blocks = [(s, min(manifest.num_samples, s + block)) for s in range(0, manifest.num_samples, block)]
    from tqdm import tqdm

    bar = tqdm(total=parts + len(blocks), unit="unit", desc="verify", disable=not progress)
    runner = _Runner(workers, path, options)
    finished = False
    try:
        checked: tuple[set, set] = (set(), set())
        results = runner.ordered([(_check_part, (i,)) for i in range(parts)])
        for problems, (local, cached) in results:
            report.problems += problems
            checked[0].update(local)
            checked[1].update(cached)
            bar.update()
        report.problems += _check_labels()
        if report.problems:
            finished = True
            return report
        frozen = (frozenset(checked[0]), frozenset(checked[1]))
        results = runner.ordered([(_check_block, (a, b, decode, frozen)) for a, b in blocks])
        try:
            for problems, structural in results:
                report.problems += problems
                bar.update()
                if structural:
                    break
                if len(report.problems) >= MAX_PROBLEMS:
                    report.problems.append(f"stopped after {MAX_PROBLEMS} problems")
                    break
        finally:
            results.close()
        finished = True
        return report
    finally:
        bar.close()
        runner.close(abort=not finished)
        _reader.close()
        _reader = None
