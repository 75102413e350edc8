"""The local engine: a process pool (packer/engine/_pool.py) preprocesses the samples, this process
writes them strictly in source order, so the output is byte-identical for any number of workers.
``run_local`` writes parts cut by source files, ``run_local_kept`` parts of N kept samples."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from packer.dedup.deduper import deduped, deduper_for
from packer.engine._job import PackJob, PartsRun
from packer.engine._part_plan import Lookahead, Plan, fill_part
from packer.engine._pool import preprocessed
from packer.engine.parts import SOURCE_COUNT_KEY, SOURCE_START_KEY, write_part
from packer.output.output_dir import remove_part_files


def run_local(job: PackJob, run: PartsRun, items: Any) -> None:
    """Parts are written in order here, so each one's first dataset index is exact."""
    writer = run.writer
    for p, _ in run.parts:
        remove_part_files(writer, p)
    todo_items = itertools.chain.from_iterable(items for _, items in run.parts)
    stream = preprocessed(todo_items, job.spec, job.pack.workers, job.pack.storage_options, writer.fields)
    begin = min(run.starts.values(), default=0)
    before = [r for r in run.done.values() if r.extra.get(SOURCE_START_KEY, 0) < begin]
    stream = deduped(stream, deduper_for(job.dedup, before, items, job.known))
    with contextlib.closing(stream):
        for p, items in run.parts:
            results = (next(stream) for _ in range(len(items)))
            first, start = run.firsts[p], run.starts[p]
            done = write_part(writer, p, results, job.pack.on_error, run.progress.update, first, start)
            run.finished(p, done)


def run_local_kept(job: PackJob, run: PartsRun, items: Any, plan: Plan, per_part: int) -> None:
    """Parts of ``per_part`` kept samples, filled in order from one stream of results, so each
    one's cut is exact the first time (packer/engine/_part_plan.py); from where the written ones end."""
    writer = run.writer
    part, start = plan.resume(run.done)
    for p in sorted(p for p in run.done if p >= part):  # provisional parts (a Ray run before)
        run.sink.drop_part(writer, run.done.pop(p))
    for p in range(part, max((c.part for c in plan.cuts), default=0) + 1):
        remove_part_files(writer, p)  # what a killed attempt left
    stream = preprocessed(items[start:], job.spec, job.pack.workers, job.pack.storage_options, writer.fields)
    before = [run.done[p] for p in run.done if p < part]
    stream = deduped(stream, deduper_for(job.dedup, before, items, job.known))
    with contextlib.closing(stream):
        results = Lookahead(stream)
        while results.more():
            filled = fill_part(results, per_part)
            first = part * per_part
            done = write_part(writer, part, filled, job.pack.on_error, run.progress.update, first, start)
            run.finished(part, done)
            start += done.extra[SOURCE_COUNT_KEY]
            part += 1
