"""The Ray engine: one task per part, each preprocessing and writing its own part files.

Workers must see ``out`` at the same path (a shared filesystem on a real cluster). Tasks return
plain dicts, so nothing but JSON-able data crosses back to the driver.

What holds when the driver dies (kill -9) while tasks run:
- a task writes its part only below ``OUT/.ray-staging/<run>/``; the driver alone moves a finished
  part into ``OUT`` and records it, so a task of a dead driver never touches a committed part;
- a task on the driver's host checks every few samples that the driver process still lives and
  stops (dropping its staged files) when it does not; on other hosts Ray ends the job's tasks;
- the next run (``--resume`` or ``--force``) deletes every ``.ray-staging`` folder first.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any

from packer.formats import FormatWriter, PartResult
from packer.lifetime import process_alive
from packer.preprocess import PreprocessSpec
from readers.errors import ImgpackError
from readers.manifest import Shard

STAGING = ".ray-staging"
WATCH_EVERY = 8  # samples between checks that the driver still lives


class DriverGone(Exception):
    pass


def _watched(results: Iterable, driver: tuple[str, int]) -> Iterator:
    for i, result in enumerate(results):
        if i % WATCH_EVERY == 0 and not process_alive(*driver):
            raise DriverGone(f"the driver {driver[1]} on {driver[0]} is gone")
        yield result


def _pack_part(
    writer: FormatWriter,
    part: int,
    items: list,
    spec: PreprocessSpec,
    on_error: str,
    driver: tuple[str, int],
) -> dict[str, Any]:
    from packer.engine import CHUNK, _preprocess_chunk, write_part
    from packer.source_items import chunked

    # A few samples at a time: preprocessing the whole part first held all its images in memory.
    results = (result for chunk in chunked(items, CHUNK) for result in _preprocess_chunk(chunk, spec))
    results = _watched(results, driver)
    return asdict(write_part(writer, part, results, on_error))


def _commit(staged: FormatWriter, final: FormatWriter, part: int) -> None:
    """Move a finished part's files from the run's staging folder into the output."""
    for old in final.part_files(part):  # what an earlier, interrupted attempt left
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    for source in staged.part_files(part):
        target = final.out / source.relative_to(staged.out)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(source, target)


def run_ray(
    writer: FormatWriter,
    parts: list,
    spec: PreprocessSpec,
    on_error: str,
    bar: Any,
    done: dict[int, PartResult],
    save: Callable[[], None],
    address: str | None,
) -> None:
    try:
        import ray
    except ImportError:
        raise ImgpackError('--engine ray needs Ray: pip install "imgpack[ray]"') from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address,
            ignore_reinit_error=True,
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
        )
    shutil.rmtree(writer.out / STAGING, ignore_errors=True)  # runs of a dead driver
    staged = _staged_writer(writer)
    driver = (socket.gethostname(), os.getpid())
    try:
        task = ray.remote(_pack_part)
        pending = {
            task.remote(staged, p, items, spec, on_error, driver): (p, len(items))
            for p, items in parts
            if p not in done
        }
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            p, n = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                if isinstance(cause, ImgpackError):
                    raise ImgpackError(str(cause).splitlines()[0]) from None
                raise
            _commit(staged, writer, p)
            done[p] = PartResult(
                result["part"],
                [Shard(**s) for s in result["shards"]],
                result["skipped"],
                result.get("extra", {}),
            )
            save()
            bar.update(n)
    finally:
        if started_here:
            ray.shutdown()
        shutil.rmtree(writer.out / STAGING, ignore_errors=True)


def _staged_writer(writer: FormatWriter) -> FormatWriter:
    """A copy of ``writer`` that writes below this run's staging folder."""
    staged = type(writer)(writer.out / STAGING / uuid.uuid4().hex, writer.spec, writer.options)
    staged.out.mkdir(parents=True)
    return staged
