"""Running a pack: scan, cut into parts, preprocess in parallel, write in order, manifest last.

Engines:
- ``local`` (default): a process pool preprocesses samples (a bounded window of small chunks in
  flight, so memory does not grow with the dataset); the main process writes them strictly in
  source order, so the output is byte-identical for any number of workers.
- ``ray``: one Ray task per part, each preprocessing and writing its own part files on storage
  all nodes share; the driver merges their results into the manifest.

Progress is recorded per finished part in ``.imgpack-progress.json``; ``resume=True`` redoes only
the parts that did not finish. The manifest is written last, atomically.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from packer.formats import FormatWriter, PartResult, writer_class
from packer.formats.base import disk_hint
from packer.lifetime import die_with_parent
from packer.output import PROGRESS_NAME, check_not_source, open_output, remove_temporaries, replace_output
from packer.preprocess import PackedSample, PreprocessSpec, SkipSample, preprocess_file
from packer.sizes import KEY as SIZES_KEY
from packer.sizes import SizeTally, merge_sizes
from packer.source import SourceItem, SourceScan, scan_folder
from packer.source_items import chunked, rel_run
from readers.errors import ImgpackError
from readers.manifest import Manifest, Shard, write_atomic, write_manifest

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
CHUNK = 8  # samples per pool task: amortises inter-process overhead, keeps order cheap


@dataclass
class PackReport:
    out: str
    format: str
    packed: int
    skipped: int
    bytes: int
    seconds: float
    shards: int
    workers: int
    engine: str
    skipped_files: list[dict[str, str]] = field(default_factory=list)
    upscaled: int | None = None  # images enlarged on the way (None: unknown, resumed old pack)

    @property
    def images_per_second(self) -> float:
        return (self.packed + self.skipped) / self.seconds if self.seconds > 0 else 0.0


Failure = tuple[int, str, str]  # (source index, relative path, reason)


def _preprocess_chunk(chunk: list[SourceItem], spec: PreprocessSpec) -> list[PackedSample | Failure]:
    out: list[PackedSample | Failure] = []
    for item in chunk:
        try:
            out.append(preprocess_file(item.path, item.rel, item.label, item.index, spec))
        except SkipSample as exc:
            out.append((item.index, item.rel, str(exc)))
    return out


def preprocessed(
    items: Iterable[SourceItem], spec: PreprocessSpec, workers: int
) -> Iterator[PackedSample | Failure]:
    """Results for ``items`` in source order, computed by ``workers`` processes.

    ``items`` is read lazily, a window of chunks ahead of the results (never listed whole).
    Close the generator (``contextlib.closing``) when stopping early: its pool is torn down then.
    """
    chunks = chunked(items, CHUNK)
    first = next(chunks, None)
    if workers <= 1 or first is None:
        for chunk in itertools.chain([first] if first else [], chunks):
            yield from _preprocess_chunk(chunk, spec)
        return
    method = "fork" if "fork" in _start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context(method),
        initializer=_worker_init,
        initargs=(os.getpid(),),
    )
    in_flight: deque = deque()
    completed = False
    try:
        window = workers * 4
        # The workers start on the first submit; an interrupt must not reach one before its
        # initializer has set it to ignore interrupts, so they are held until then.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            in_flight.append(pool.submit(_preprocess_chunk, first, spec))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for chunk in chunks:
            in_flight.append(pool.submit(_preprocess_chunk, chunk, spec))
            if len(in_flight) >= window:
                yield from in_flight.popleft().result()
        while in_flight:
            yield from in_flight.popleft().result()
        completed = True
    finally:
        if not completed:
            # Interrupted or failed: stop the workers now rather than wait for their chunks
            # (waiting on a pool mid-interrupt is what used to hang).
            processes = list((pool._processes or {}).values())
            for process in processes:
                process.kill()
            for process in processes:
                process.join(5)
            # A worker killed while sending its result leaves half a message in the result pipe,
            # and the pool's manager thread would wait for the rest forever (seen 1 in 20 Ctrl-Cs);
            # with the last writer closed it reads end-of-file instead and shuts down.
            pool._result_queue._writer.close()
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_init(parent: int) -> None:
    """Pool workers leave interrupts to the parent and die when it dies (even by kill -9)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent(parent)


def _start_methods() -> list[str]:
    from multiprocessing import get_all_start_methods

    return get_all_start_methods()


def write_part(
    writer: FormatWriter,
    part: int,
    results: Iterable[PackedSample | Failure],
    on_error: str,
    tick: Callable[[int], None] = lambda n: None,
) -> PartResult:
    """Feed one part's results to a fresh part writer; failures become skips (or an error)."""
    part_writer = writer.open_part(part)
    skipped: list[dict[str, str]] = []
    sizes = SizeTally()
    try:
        for result in results:
            if isinstance(result, tuple):
                _, rel, reason = result
                if on_error == "fail":
                    raise ImgpackError(f"{rel}: {reason} (--on-error fail stops at the first bad file)")
                skipped.append({"path": rel, "reason": reason})
            else:
                part_writer.add(result)
                sizes.add(result)
            tick(1)
        shards = part_writer.close()
    except OSError as exc:
        part_writer.abort()
        raise ImgpackError(
            f"{writer.out}: cannot write the output ({_one_line(exc)}); {disk_hint(writer.out)}"
        ) from None
    except BaseException:
        part_writer.abort()
        raise
    return PartResult(part, shards, skipped, {**part_writer.summary(), SIZES_KEY: sizes.to_dict()})


def _one_line(exc: OSError) -> str:
    return " ".join((exc.strerror or str(exc)).split())


# -- progress and resume -------------------------------------------------------------------------


def _fingerprint(scan: SourceScan, fmt: str, spec: PreprocessSpec, options: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([fmt, spec.to_dict(), options, scan.classes], sort_keys=True).encode())
    digest.update(rel_run(scan.items))  # every rel, UTF-8 (surrogateescape), NUL-terminated
    return digest.hexdigest()


def _load_progress(out: Path, fingerprint: str) -> dict[int, PartResult]:
    path = out / PROGRESS_NAME
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if data.get("fingerprint") != fingerprint:
        raise ImgpackError(
            f"{out}: the interrupted pack used other sources or options; "
            "re-run with the same ones, or use --force to start over"
        )
    return {
        int(p["part"]): PartResult(
            int(p["part"]), [Shard(**s) for s in p["shards"]], p["skipped"], p.get("extra", {})
        )
        for p in data.get("parts", [])
    }


def _save_progress(out: Path, fingerprint: str, done: dict[int, PartResult]) -> None:
    data = {"fingerprint": fingerprint, "parts": [asdict(done[k]) for k in sorted(done)]}
    with _writing(out, "progress file"):
        write_atomic(out / PROGRESS_NAME, json.dumps(data))


def _writing(out: Path, what: str) -> contextlib.AbstractContextManager:
    """Turn an OSError (disk full, read-only) while writing ``what`` into one clear line."""

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except OSError as exc:
            raise ImgpackError(
                f"{out}: cannot write the {what} ({_one_line(exc)}); {disk_hint(out)}, "
                "then re-run with --resume"
            ) from None

    return guard()


# -- the pack ------------------------------------------------------------------------------------


def _run_local(writer, parts, spec, workers, on_error, progress, done, save) -> None:
    todo = [(p, items) for p, items in parts if p not in done]
    for p, _ in todo:
        for path in writer.part_files(p):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    stream = preprocessed(itertools.chain.from_iterable(items for _, items in todo), spec, workers)
    with contextlib.closing(stream):
        for p, items in todo:
            results = (next(stream) for _ in range(len(items)))
            done[p] = write_part(writer, p, results, on_error, progress.update)
            save()


def pack_folder(
    src: str | os.PathLike | SourceScan,
    out: str | os.PathLike,
    fmt: str = "lmdb",
    spec: PreprocessSpec | None = None,
    *,
    workers: int | None = None,
    engine: str = "local",
    options: dict[str, Any] | None = None,
    on_error: str = "skip",
    force: bool = False,
    resume: bool = False,
    quiet: bool = True,
    ray_address: str | None = None,
) -> PackReport:
    """Pack the image folder ``src`` (or an already scanned source) into ``out`` in format ``fmt``."""
    started = time.perf_counter()
    spec = spec or PreprocessSpec()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error={on_error!r}; use 'skip' or 'fail'")
    workers = max(1, workers or os.cpu_count() or 1)
    out = Path(out)
    writer_class(fmt)(out, spec, options)  # option errors before anything is touched
    scan = src if isinstance(src, SourceScan) else scan_folder(src)
    check_not_source(scan.root, out)
    work, lock = open_output(out, force, resume)
    try:
        job = (scan, fmt, spec, options, workers, engine, on_error, resume, quiet, ray_address, started)
        return _pack_into(work, out, *job)
    finally:
        lock.release()


def _pack_into(
    work: Path,
    out: Path,
    scan: SourceScan,
    fmt: str,
    spec: PreprocessSpec,
    options: dict[str, Any],
    workers: int,
    engine: str,
    on_error: str,
    resume: bool,
    quiet: bool,
    ray_address: str | None,
    started: float,
) -> PackReport:
    """The pack proper, into ``work`` (``out`` or its staging sibling), the output lock held."""
    from tqdm import tqdm

    writer = writer_class(fmt)(work, spec, options)
    spec = writer.spec  # a format may pin part of the spec (--to bmp implies --encode bmp)
    fingerprint = _fingerprint(scan, fmt, spec, options)
    remove_temporaries(work)
    done = _load_progress(work, fingerprint) if resume else {}
    for p in [p for p, result in done.items() if not writer.part_intact(result)]:
        del done[p]  # damaged by the interruption: written again
    _save_progress(work, fingerprint, done)  # from the start: any kill leaves a resumable output
    per_part = writer.samples_per_part(len(scan.items))
    parts = [(i // per_part, scan.items[i : i + per_part]) for i in range(0, len(scan.items), per_part)]
    remaining = sum(len(items) for p, items in parts if p not in done)
    with tqdm(total=remaining, unit="img", disable=quiet, desc=f"pack {fmt}", dynamic_ncols=True) as bar:
        save = functools.partial(_save_progress, work, fingerprint, done)
        if engine == "local":
            _run_local(writer, parts, spec, workers, on_error, bar, done, save)
        elif engine == "ray":
            from packer.ray_engine import run_ray

            run_ray(writer, parts, spec, on_error, bar, done, save, ray_address)
        else:
            raise ImgpackError(f"unknown engine {engine!r}; use local or ray")
    results = [done[p] for p, _ in parts]
    with _writing(work, "dataset"):
        shards, extra = writer.finish(results, scan.classes)
    skipped = scan.skipped + [s for r in results for s in r.skipped]
    if not shards or sum(s.count for s in shards) == 0:
        first = f"{skipped[0]['path']}: {skipped[0]['reason']}" if skipped else "-"
        raise ImgpackError(f"{scan.root}: every image was skipped ({len(skipped)}); first reason: {first}")
    manifest = Manifest(
        format=fmt,
        num_samples=sum(s.count for s in shards),
        classes=scan.classes,
        encoding=spec.encode,
        preprocess=spec.to_dict(),
        shards=shards,
        skipped=skipped,
        stored_sizes=merge_sizes(r.extra for r in results),
        extra={**extra, "source": str(scan.root.resolve()), "empty_classes": scan.empty_classes}
        | scan.extra,
    )
    with _writing(work, "manifest"):
        write_manifest(work, manifest)
    replace_output(work, out)
    return PackReport(
        str(out),
        fmt,
        manifest.num_samples,
        len(skipped),
        sum(s.bytes for s in shards),
        time.perf_counter() - started,
        len(shards),
        workers,
        engine,
        skipped,
        (manifest.stored_sizes or {}).get("upscaled"),
    )
