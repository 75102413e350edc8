"""The Ray engine: one task per part, each preprocessing and writing its own part files.

With a local ``out``, workers must see it at the same path (a shared filesystem on a real
cluster). With a URL ``out`` (packer/output/remote_output.py) nothing is shared: each task writes its
part in a temporary folder on its own node and uploads it itself, and tasks read URL sources
themselves, so the driver never handles image bytes. Tasks return plain dicts, so nothing but
JSON-able data crosses back to the driver.

What holds when the driver dies (kill -9) while tasks run:
- a task writes its part only below ``OUT/.ray-staging/<run>/``; the driver alone moves a finished
  part into ``OUT`` and records it, so a task of a dead driver never touches a committed part;
- a task on the driver's host checks every few samples that the driver process still lives and
  stops (dropping its staged files) when it does not; on other hosts Ray ends the job's tasks;
- the next run (``--resume`` or ``--force``) deletes every ``.ray-staging`` folder first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packer.dedup.deduper import applied, skips_of
from packer.engine._lifetime import process_alive
from packer.engine._ray_carry import Carried, Keeper, carried_or_preprocessed, overlapping, settle
from packer.engine.parts import BLOCK, part_from_dict, part_to_dict, preprocess_chunk, write_part
from packer.output.output_dir import RAY_STAGING as STAGING
from packer.output.pack_order import ordered_items
from readers.errors import ImgpackError
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.writer_base import FormatWriter

if TYPE_CHECKING:
    from packer.engine._job import PackJob, PartsRun

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
    sink: Any = None,
    storage_options: dict[str, Any] | None = None,
    first: int = 0,
    start: int = 0,
    sources: list[tuple[int, int, Any]] | None = None,
    skips: dict[int, str] | None = None,
) -> tuple[dict[str, Any], list | None]:
    """The task: preprocess and write one part (reading URL sources itself); with a remote
    ``sink``, in a temporary folder on this node, uploaded from here when complete. Its samples
    are numbered from ``first``; they start at ``start`` in the pack order (packer/engine/_part_plan.py).
    Results earlier tasks carried (``sources``) are not preprocessed again; this part's own are
    returned with its record (packer/engine/_ray_carry.py). ``skips``: its --dedup duplicates."""
    keeper = Keeper()
    preprocessed = carried_or_preprocessed(items, start, sources or [], spec, storage_options, writer.fields)
    results = applied(keeper.through(_watched(preprocessed, driver)), skips or {})
    if sink is None or not sink.remote:
        written = write_part(writer, part, results, on_error, first=first, start=start)
        return part_to_dict(written), keeper.kept
    with tempfile.TemporaryDirectory(prefix="imgpack-part-") as tmp:
        local = writer.at(Path(tmp))
        written = write_part(local, part, results, on_error, first=first, start=start)
        return part_to_dict(sink.part_done(local, written)), keeper.kept


def _commit(staged: FormatWriter, final: FormatWriter, part: int) -> None:
    """Move a finished part's files from the run's staging folder into the output."""
    for old in final.part_files(part + final.part_base):  # what an earlier, interrupted attempt left
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    for source in staged.part_files(part + staged.part_base):
        target = final.out / source.relative_to(staged.out)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(source, target)


RAY_PROBE_TIMEOUT = 5.0  # seconds to reach a cluster's head before the address is called wrong
RAY_ADDRESS_FIX = (
    "give the host:port of a running Ray head (`ray start --head` prints it; ray:// for Ray "
    "Client), or leave --ray-address out to start a local cluster"
)


def check_ray_address(address: str | None) -> None:
    """Refuse, in one line, a ``--ray-address`` that no Ray head answers at: ``ray.init`` would
    retry it for minutes, then end in a traceback."""
    if address in (None, "", "auto", "local"):
        return
    assert address is not None
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ImgpackError(f"--ray-address {address}: not a host:port address; {RAY_ADDRESS_FIX}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_PROBE_TIMEOUT).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ImgpackError(
            f"--ray-address {address}: no Ray cluster answers there ({reason}); {RAY_ADDRESS_FIX}"
        ) from None


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray connected for the rounds of one pack (on ``address``, or a local cluster started here
    and stopped at the end), so a re-cut neither starts a cluster again nor loses the results
    carried in the object store."""
    try:
        import ray
    except ImportError:
        raise ImgpackError('--engine ray needs Ray: pip install "imgpack[ray]"') from None
    started_here = not ray.is_initialized()
    if started_here:
        check_ray_address(address)
        ray.init(
            address=address,
            ignore_reinit_error=True,
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
        )
    try:
        yield
    finally:
        if started_here:
            ray.shutdown()


def run_ray(job: PackJob, run: PartsRun) -> None:
    """Every part of ``run`` not done yet, one Ray task each (in a ``ray_session``)."""
    with ray_session(job.pack.ray_address):
        _run_tasks(job, run)


def _run_tasks(job: PackJob, run: PartsRun) -> None:
    import ray

    writer, sink = run.writer, run.sink
    shutil.rmtree(writer.out / STAGING, ignore_errors=True)  # runs of a dead driver
    remote = sink.remote
    staged = writer if remote else _staged_writer(writer)
    driver = (socket.gethostname(), os.getpid())
    carried: Carried = run.carry.setdefault("results", {})
    pending: dict[Any, Any] = {}
    try:
        task = ray.remote(num_returns=2)(_pack_part)
        common = (job.spec, job.pack.on_error, driver, sink, job.pack.storage_options)
        if job.dedup and "dedup" not in run.carry:  # once a pack: every re-cut round reuses it
            run.carry["dedup"] = dedup_skips(job)
        skips = run.carry.get("dedup", {})
        for p, items in run.parts:
            first, start = run.firsts.get(p, 0), run.starts.get(p, 0)
            sources = overlapping(carried, start, len(items))
            own = {item.index: skips[item.index] for item in items if item.index in skips}
            record, results = task.remote(staged, p, items, *common, first, start, sources, own)
            pending[record] = (p, start, len(items), results)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            p, start, n, results = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                if isinstance(cause, ImgpackError):
                    raise ImgpackError(_task_message(str(cause))) from None
                raise
            if not remote:  # a remote part was uploaded by its task
                _commit(staged, writer, p)
            run.done[p] = part_from_dict(result)  # a task has handed its part to the output itself
            carried[start] = (n, results)
            settle(carried, run.done)
            run.save()
            run.progress.update(n)
    finally:
        _stop(pending)  # an interrupted run: no task may write after its staging folder goes
        shutil.rmtree(writer.out / STAGING, ignore_errors=True)


def _stop(pending: dict[Any, Any]) -> None:
    """Kill the tasks still running and wait (30 s at most) until they are gone."""
    import ray

    for ref in pending:
        ray.cancel(ref, force=True)
    if pending:
        ray.wait(list(pending), num_returns=len(pending), timeout=30)


def _hash_chunk(chunk: list, spec: PreprocessSpec, storage_options: dict[str, Any] | None) -> list:
    """(source index, rel, phash, digest) of each item of ``chunk``, or its failure."""
    return [r if isinstance(r, tuple) else (r.source_index, r.rel, r.phash, r.digest)
            for r in preprocess_chunk(chunk, spec, storage_options)]  # fmt: skip


def dedup_skips(job: PackJob) -> dict[int, str]:
    """The --dedup skips of the whole pack: every item hashed by Ray tasks, then one Deduper
    over the hashes in pack order (packer/dedup/deduper.py), as the local engine's stream would."""
    import ray

    items = ordered_items(job.scan.items, job.order["kind"], job.order["seed"])
    task = ray.remote(_hash_chunk)
    step = BLOCK * 8
    chunks = [list(items[a : a + step]) for a in range(0, len(items), step)]
    refs = [task.remote(chunk, job.spec, job.pack.storage_options) for chunk in chunks]
    return skips_of((h for ref in refs for h in ray.get(ref)), job.dedup or {}, job.known)


def _task_message(text: str) -> str:
    """The error's own message out of Ray's rendering of it (a ``ray::task()`` header, the
    task's traceback, then ``module.Error: message``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        match = re.match(r"^\s*[\w.]*Error: (.*)$", line)
        if match:
            return match.group(1)
    return lines[0] if lines else text


def _staged_writer(writer: FormatWriter) -> FormatWriter:
    """A copy of ``writer`` that writes below this run's staging folder."""
    staged = writer.at(writer.out / STAGING / uuid.uuid4().hex)
    staged.out.mkdir(parents=True)
    return staged
