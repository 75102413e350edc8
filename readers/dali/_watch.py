"""What goes wrong while DALI runs, said as an error: a py_workers process that died, a sample that failed.

DALI blocks for ever when one of its parallel external_source processes is killed (on a semaphore
the dead process held), and its decoder reports a failure without naming the sample. ``watched``
turns the first into an error instead of a hang; ``named_failure`` finds the sample of the second
by decoding the batches around it with imgpack's own decoder.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from readers.dali._feed import BatchFeed
from readers.errors import DecodeError, ImgpackError

WATCH_INTERVAL = 0.5  # seconds between checks that the py_workers processes are alive


def watched(iterator: Any, py_workers: int, path: Any) -> Iterator[Any]:
    """``iterator``'s (a DALI iterator's) items; with ``py_workers`` each is fetched on a helper
    thread while the worker processes are watched: a dead one is an error naming ``path``."""
    if not py_workers:
        yield from iterator
        return
    requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
    results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def fetch() -> None:  # a daemon thread: one stuck on a dead worker must not block exit
        while requests.get():
            try:
                results.put((True, next(iterator)))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, StopIteration too
                results.put((False, exc))
                return

    threading.Thread(target=fetch, name="imgpack-dali-fetch", daemon=True).start()
    try:
        while True:
            requests.put(True)
            while True:
                try:
                    ok, value = results.get(timeout=WATCH_INTERVAL)
                    break
                except queue.Empty:
                    death = worker_death(iterator, path)
                    if death is not None:
                        raise death from None
            if not ok:
                if isinstance(value, StopIteration):
                    return
                raise value
            yield value
    finally:
        requests.put(False)


def worker_death(iterator: Any, path: Any) -> ImgpackError | None:
    """An error naming a py_workers process of ``iterator``'s pipelines that has exited, or None.
    The pool's other processes are killed then: one blocked on a lock the dead one held would
    otherwise keep this interpreter from exiting (multiprocessing joins its children at exit)."""
    for pipe in getattr(iterator, "_pipes", None) or []:
        pool = getattr(getattr(pipe, "_py_pool", None), "pool", None)
        processes = list(getattr(pool, "_processes", None) or [])
        for process in processes:
            if process.exitcode is not None:
                for other in processes:
                    if other.exitcode is None:
                        other.kill()
                        other.join(5)
                return ImgpackError(
                    f"{path}: a DALI py_workers process (pid {process.pid}) exited "
                    f"with code {process.exitcode} (killed?); this loader's pipeline cannot go "
                    "on: build a new dali_loader (and resume from its state_dict), or pass py_workers=0"
                )
    return None


def named_failure(feed: BatchFeed, epoch: int, exc: RuntimeError, batch: int, prefetch: int) -> ImgpackError:
    """A DecodeError naming the sample that failed in DALI's pipeline, found by decoding batch
    ``batch`` of ``epoch`` and the ones DALI may have prefetched past it with imgpack's own decoder."""
    from readers.image.decode import decode_array, naming_decode_errors

    for i in range(batch, min(batch + prefetch + 2, feed.batches_in(epoch))):
        records = feed.records(epoch, i)
        decoded = (decode_array(r) for r in records)
        try:
            indices = feed.batch_indices(epoch, i)
            for _ in naming_decode_errors(decoded, feed.reader, indices, records):
                pass
        except DecodeError as named:
            return DecodeError(f"{named}; found after DALI's pipeline failed")
    cause = next((line.strip() for line in str(exc).splitlines() if "failure" in line), str(exc)[:200])
    return DecodeError(
        f"{feed.path}: DALI's pipeline failed at batch {batch} of epoch {epoch} ({cause}); "
        f"run `pack verify {feed.path}`, or read with device=\"dataloader\""
    )
