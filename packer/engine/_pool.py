"""The local engine's process pool: preprocessed results in source order, from a bounded window
of small chunks in flight (so memory does not grow with the dataset), torn down at once when
the pack stops (packer/engine/pack_run.py writes what it yields)."""

from __future__ import annotations

import itertools
import os
import signal
from collections import deque
from collections.abc import Generator, Iterable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from packer.engine._lifetime import die_with_parent
from packer.engine.parts import Failure, preprocess_chunk
from packer.scan.source_items import chunked
from packer.sources.source import SourceItem
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.remote.urls import is_url

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
CHUNK = 8  # samples per pool task: amortises inter-process overhead, keeps order cheap
URL_CHUNK = 32  # from a URL source: more reads in flight per task (measured ~25% faster than 8)


def preprocessed(
    items: Iterable[SourceItem],
    spec: PreprocessSpec,
    workers: int,
    storage_options: dict[str, Any] | None = None,
    schema: dict[str, str] | None = None,
) -> Generator[PackedSample | Failure, None, None]:
    """Results for ``items`` in source order, computed by ``workers`` processes (boxes of a field
    ``schema`` moved with the pixels there).

    ``items`` is read lazily, a window of chunks ahead of the results (never listed whole).
    Close the generator (``contextlib.closing``) when stopping early: its pool is torn down then.
    """
    items = iter(items)
    head = next(items, None)
    if head is None:
        return
    size = URL_CHUNK if is_url(head.path) else CHUNK
    chunks = chunked(itertools.chain([head], items), size)
    first = next(chunks)
    if workers <= 1:
        for chunk in itertools.chain([first], chunks):
            yield from preprocess_chunk(chunk, spec, storage_options, schema)
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
            in_flight.append(pool.submit(preprocess_chunk, first, spec, storage_options, schema))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for chunk in chunks:
            in_flight.append(pool.submit(preprocess_chunk, chunk, spec, storage_options, schema))
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
            pool._result_queue._writer.close()  # type: ignore[attr-defined]  # private: see above
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
