"""Running a pack: scan, cut into parts, preprocess in parallel, write in order, manifest last.

Engines:
- ``local`` (default): a process pool (packer/pool.py) preprocesses samples (a bounded window
  of small chunks in flight, so memory does not grow with the dataset); the main process writes
  them strictly in source order, so the output is byte-identical for any number of workers.
- ``ray``: one Ray task per part, each preprocessing and writing its own part files on storage
  all nodes share; the driver merges their results into the manifest.

Progress is recorded per finished part in ``.imgpack-progress.json``; ``resume=True`` redoes only
the parts that did not finish. The manifest is written last, atomically.

Source and output may be fsspec URLs: packer/remote_source.py lists a URL source,
packer/remote_output.py uploads parts to a URL output (packer/output.py's ``LocalOutput`` is its
local twin; both are an ``Output``). The pack itself is a ``PackJob`` (packer/job.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packer.dedup import dedup_record, deduped, deduper_for
from packer.job import PackJob, PartsRun
from packer.output import (
    LocalOutput,
    Output,
    OutputLock,
    check_not_source,
    open_output,
    remove_part_files,
    remove_temporaries,
)
from packer.pack_order import order_record, ordered_items, write_source_paths
from packer.part_hashes import write_sidecar
from packer.part_plan import Lookahead, Plan, fill_part, plan_parts
from packer.parts import (
    SOURCE_COUNT_KEY,
    SOURCE_START_KEY,
    field_counts,
    one_line,
    part_from_dict,
    part_to_dict,
    write_part,
)
from packer.pool import preprocessed
from packer.sizes import merge_sizes
from packer.source import SourceScan, scan_folder
from packer.source_items import rel_run
from readers.errors import ImgpackError, OptionError
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import open_writer, refuse_fields
from readers.formats.writer_base import FormatWriter, PartResult, disk_hint
from readers.manifest import PROGRESS_NAME, Manifest, write_atomic, write_manifest
from readers.order import PACK_ORDERS
from readers.remote import is_url

StorageOptions = dict[str, Any] | None
MAX_ROUNDS = 4  # cuts re-planned as skips become known: 2 rounds at most for a stable source


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


# -- progress and resume -------------------------------------------------------------------------


def _fingerprint(
    scan: SourceScan, fmt: str, spec: PreprocessSpec, options: dict[str, Any], order: dict[str, Any]
) -> str:
    digest = hashlib.sha256()
    asked: list[Any] = [fmt, spec.to_dict(), options, scan.classes, order]
    if scan.fields:  # a resumed pack must carry the same fields
        asked.append(scan.fields)
    digest.update(json.dumps(asked, sort_keys=True).encode())
    digest.update(rel_run(scan.items))  # every rel, UTF-8 (surrogateescape), NUL-terminated
    if scan.fields:
        for item in scan.items:
            digest.update(item.fields.encode() + b"\0")
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
    return {int(p["part"]): part_from_dict(p) for p in data.get("parts", [])}


def _save_progress(out: Path, fingerprint: str, done: dict[int, PartResult]) -> None:
    data = {"fingerprint": fingerprint, "parts": [part_to_dict(done[k]) for k in sorted(done)]}
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
                f"{out}: cannot write the {what} ({one_line(exc)}); {disk_hint(out)}, "
                "then re-run with --resume"
            ) from None

    return guard()


# -- the pack ------------------------------------------------------------------------------------


def _run_local(job: PackJob, run: PartsRun, items: Any) -> None:
    """Parts are written in order here, so each one's first dataset index is exact."""
    writer = run.writer
    for p, _ in run.parts:
        remove_part_files(writer, p)
    todo_items = itertools.chain.from_iterable(items for _, items in run.parts)
    stream = preprocessed(todo_items, job.spec, job.workers, job.storage_options, writer.fields)
    begin = min(run.starts.values(), default=0)
    before = [r for r in run.done.values() if r.extra.get(SOURCE_START_KEY, 0) < begin]
    stream = deduped(stream, deduper_for(job.dedup, before, items, job.known))
    with contextlib.closing(stream):
        for p, items in run.parts:
            results = (next(stream) for _ in range(len(items)))
            first, start = run.firsts[p], run.starts[p]
            run.finished(p, write_part(writer, p, results, job.on_error, run.progress.update, first, start))


def _run_local_kept(job: PackJob, run: PartsRun, items: Any, plan: Plan, per_part: int) -> None:
    """Parts of ``per_part`` kept samples, filled in order from one stream of results, so each
    one's cut is exact the first time (packer/part_plan.py); from where the written ones end."""
    writer = run.writer
    part, start = plan.resume(run.done)
    for p in sorted(p for p in run.done if p >= part):  # provisional parts (a Ray run before)
        run.sink.drop_part(writer, run.done.pop(p))
    for p in range(part, max((c.part for c in plan.cuts), default=0) + 1):
        remove_part_files(writer, p)  # what a killed attempt left
    stream = preprocessed(items[start:], job.spec, job.workers, job.storage_options, writer.fields)
    before = [run.done[p] for p in run.done if p < part]
    stream = deduped(stream, deduper_for(job.dedup, before, items, job.known))
    with contextlib.closing(stream):
        results = Lookahead(stream)
        while results.more():
            filled = fill_part(results, per_part)
            done = write_part(writer, part, filled, job.on_error, run.progress.update, part * per_part, start)
            run.finished(part, done)
            start += done.extra[SOURCE_COUNT_KEY]
            part += 1


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
    order: str = "shuffled",
    seed: int = 0,
    force: bool = False,
    resume: bool = False,
    quiet: bool = True,
    ray_address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    dedup: str | None = None,
    near_distance: int | None = None,
    base: tuple[Path, Manifest] | None = None,
    known: Any = None,
) -> PackReport:
    """Pack the image folder ``src`` (or an already scanned source) into ``out`` in format ``fmt``.

    The samples are written in a permutation of the source seeded by ``seed`` (``order="shuffled"``)
    or in the source order (``order="source"``); see packer/pack_order.py.
    ``src`` and ``out`` may be fsspec URLs (``s3://...``), opened with ``storage_options``.
    ``dedup`` ("exact" or "near", within ``near_distance`` bits) skips duplicates (packer/dedup.py).
    ``base``: (root, manifest) of a dataset the samples are appended to (packer/append.py), and
    ``known`` its samples that ``dedup`` compares the new ones with (packer.dedup.Known)."""
    started = time.perf_counter()
    spec = spec or PreprocessSpec()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    if on_error not in ("skip", "fail"):
        raise OptionError(f"on_error={on_error!r}; use 'skip' or 'fail'")
    if order not in PACK_ORDERS:
        raise ImgpackError(f"order={order!r}; use one of {', '.join(PACK_ORDERS)}")
    if force and resume:
        raise OptionError(
            f"{out}: --force (start over) and --resume (finish the interrupted pack) contradict "
            "each other; pass one of them"
        )
    workers = max(1, workers or os.cpu_count() or 1)
    deduping = dedup_record(dedup, near_distance)
    writer = open_writer(fmt, Path(out), spec, options)  # option errors before anything is touched
    if engine == "ray":
        from packer.ray_engine import check_ray_address

        check_ray_address(ray_address)  # before the output is touched
    if is_url(out):
        from packer.remote_output import check_remote_format

        check_remote_format(writer.format, str(out))
    scan = src if isinstance(src, SourceScan) else _scan(src, storage_options)
    refuse_fields(writer.format, scan.fields)
    writer = writer.with_fields(scan.fields, scan.classes)
    if base is not None:
        writer = writer.extending(base[0], base[1].num_samples, len(base[1].shards))
    sink, work, lock = _open(scan, out, force, resume, storage_options)
    try:
        job = PackJob(scan, fmt, writer.spec, options, workers, engine, on_error, resume, quiet, ray_address,
                      storage_options, started, order_record(order, seed), deduping, known)  # fmt: skip
        return _pack_into(job, writer.at(work), sink)
    finally:
        lock.release()


def _scan(src: str | os.PathLike, storage_options: dict[str, Any] | None) -> SourceScan:
    if is_url(src):
        from packer.remote_source import scan_url

        return scan_url(str(src), storage_options)
    return scan_folder(src)


def _open(
    scan: SourceScan, out: str | os.PathLike, force: bool, resume: bool, storage_options: StorageOptions
) -> tuple[Output, Path, OutputLock]:
    """(where parts go, the folder they are written into, the lock held on it)."""
    if is_url(out):
        from packer.remote_output import RemoteOutput, same_place

        if same_place(scan.root, out):
            raise ImgpackError(f"{out}: the output overlaps the source {scan.root}; choose another -o")
        sink = RemoteOutput(str(out), storage_options)
        return (sink, *sink.open(force, resume))
    if not is_url(scan.root):
        check_not_source(scan.root, Path(out))
    return (LocalOutput(Path(out)), *open_output(Path(out), force, resume))


def _run_rounds(
    job: PackJob, writer: FormatWriter, sink: Output, items: Any, done: dict[int, PartResult], save: Any
) -> Plan:
    """Write the parts, re-planning the cut as the skips become known, until every part of the
    plan is written and fits it (packer/part_plan.py); the final plan."""
    from tqdm import tqdm

    per_part, by_kept = writer.samples_per_part(len(items)), writer.parts_hold_kept()
    carry: dict[str, Any] = {}  # what the engine keeps between rounds (Ray: carried results)
    for _ in range(MAX_ROUNDS):
        plan = plan_parts(len(items), per_part, by_kept, done)
        for p in [p for p, result in done.items() if not plan.fits(result, writer.stores_indices)]:
            sink.drop_part(writer, done.pop(p))  # cut otherwise now that more skips are known
        todo = [c for c in plan.cuts if c.part not in done]
        if not todo:
            break
        save()
        pool_fills = job.engine == "local" and by_kept
        remaining = len(items) - plan.resume(done)[1] if pool_fills else sum(c.stop - c.start for c in todo)
        desc = f"pack {job.fmt}"
        with tqdm(total=remaining, unit="img", disable=job.quiet, desc=desc, dynamic_ncols=True) as bar:
            parts = [(c.part, items[c.start : c.stop]) for c in todo]
            firsts, starts = {c.part: c.first for c in todo}, {c.part: c.start for c in todo}
            run = PartsRun(writer, parts, done, sink, bar, save, firsts, starts, carry)
            if pool_fills:
                _run_local_kept(job, run, items, plan, per_part)
            elif job.engine == "local":
                _run_local(job, run, items)
            else:
                from packer.ray_engine import run_ray

                run_ray(job, run)
    else:
        raise ImgpackError(
            f"{job.scan.root}: files decoded differently on each attempt (changed while packing?); "
            "re-run with --resume once the source is stable"
        )
    return plan


def _pack_into(job: PackJob, writer: FormatWriter, sink: Output) -> PackReport:
    """The pack proper, by ``writer`` into ``writer.out`` (``out``, its staging sibling, or the
    local staging folder of a URL output), the lock on it held; ``sink`` takes the parts."""
    work, scan = writer.out, job.scan
    asked_order = job.order if job.dedup is None else {**job.order, "dedup": job.dedup}
    fingerprint = _fingerprint(scan, job.fmt, job.spec, job.options, asked_order)
    remove_temporaries(work)
    if job.resume and not (work / PROGRESS_NAME).exists():
        print(f"{sink.location}: nothing to resume (no interrupted pack there); packing from the start",
              file=sys.stderr)  # fmt: skip
    done = _load_progress(work, fingerprint) if job.resume else {}
    for p in [p for p, result in done.items() if not sink.part_intact(writer, result)]:
        del done[p]  # damaged by the interruption: written again

    def save() -> None:
        _save_progress(work, fingerprint, done)
        sink.saved(work)

    save()  # from the start: any kill leaves a resumable output
    items = ordered_items(scan.items, job.order["kind"], job.order["seed"])
    if job.engine not in ("local", "ray"):
        raise ImgpackError(f"unknown engine {job.engine!r}; use local or ray")
    session: contextlib.AbstractContextManager = contextlib.nullcontext()
    if job.engine == "ray":
        from packer.ray_engine import ray_session

        session = ray_session(job.ray_address)
    with session:
        plan = _run_rounds(job, writer, sink, items, done, save)
    parts = [(c.part, items[c.start : c.stop]) for c in plan.cuts]
    results = [done[p] for p, _ in parts]
    with _writing(work, "source paths"):
        write_source_paths(work, parts, done)
    with _writing(work, "dataset"):
        hashes = write_sidecar(work, results)  # before the finish: a remote one uploads it
        shards, extra = sink.finish(writer, results, scan.classes)
    # An append's own manifest numbers its shards from 0 (packer/append.py shifts them back).
    shards = [replace(s, first=s.first - writer.index_base) for s in shards]
    skipped = scan.skipped + sorted((s for r in results for s in r.skipped), key=lambda s: s["path"])
    if not shards or sum(s.count for s in shards) == 0:
        first = f"{skipped[0]['path']}: {skipped[0]['reason']}" if skipped else "-"
        sink.discard(work)  # nothing to resume: a retry must not meet a half-made output
        raise ImgpackError(
            f"{scan.root}: every image was skipped ({len(skipped)}), so no dataset was written; "
            f"first reason: {first}"
        )
    manifest = Manifest(
        format=job.fmt,
        num_samples=sum(s.count for s in shards),
        classes=scan.classes,
        encoding=job.spec.encode,
        preprocess=job.spec.to_dict(),
        shards=shards,
        skipped=skipped,
        stored_sizes=merge_sizes(r.extra for r in results),
        fields=dict(scan.fields),
        field_counts=field_counts(results),
        extra={
            **extra,
            **hashes,
            "source": _source_name(scan.root),
            "empty_classes": scan.empty_classes,
            "order": job.order,
        }
        | ({"dedup": job.dedup} if job.dedup else {})
        | scan.extra,
    )
    with _writing(work, "manifest"):
        write_manifest(work, manifest)
    sink.commit(work)
    return PackReport(
        sink.location,
        job.fmt,
        manifest.num_samples,
        len(skipped),
        sum(s.bytes for s in shards),
        time.perf_counter() - job.started,
        len(shards),
        job.workers,
        job.engine,
        skipped,
        (manifest.stored_sizes or {}).get("upscaled"),
    )


def _source_name(root: str | os.PathLike) -> str:
    return str(root) if is_url(root) else str(Path(root).resolve())
