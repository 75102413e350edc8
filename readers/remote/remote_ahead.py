"""Requests in flight ahead of the consumer, for datasets behind a URL.

A pass's order is known before its first read (``readers.datasets.stream``), so each reading process can
ask the server for what it will read next while it decodes what it has:

- **ranged reads** (tar without a ``cache_dir``): the byte ranges the pass will read are planned
  up front, neighbours closer than ``IMGPACK_REMOTE_MERGE_GAP`` bytes merged into one request of
  at most ``IMGPACK_REMOTE_REQUEST_BYTES``, and up to ``IMGPACK_REMOTE_REQUESTS`` requests kept in
  flight on helper threads, in the order the pass needs them; fetched and in-flight bytes stay
  within ``IMGPACK_REMOTE_AHEAD_BYTES`` (plus the one request the consumer waits for). A read is
  served from a fetched buffer, which is dropped once its last planned read has taken its part;
  a read that was not planned goes to the server directly. The DataLoader workers of a rank plan
  the rank's requests together and fetch each once, sharing it through a spool
  (``readers.remote._spool``).
- **whole parts** (any format through a ``cache_dir``): helper threads download the parts in
  the order the pass first needs them, up to ``IMGPACK_REMOTE_REQUESTS`` at once and at most
  ``IMGPACK_REMOTE_AHEAD_BYTES`` of downloaded parts ahead of those the reader has opened.

Merging is done only among the ranges of one stretch of the pass (a quarter to all of the byte
budget, cut where shuffle windows end: ``stretches``), so a request holds bytes that are needed at
about the same time. Every request is a bounded
``remote_call`` (``IMGPACK_REMOTE_TIMEOUT``): a stalled server is a ``RemoteError`` for the
read that waits on it, never an endless wait. Nothing here changes what is read, or in which order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.errors import OptionError
from readers.remote._range_plan import Request, as_table, plan_requests, read_ranges
from readers.remote.urls import CALL_BOUND_ENV, RemoteError, call_bound

MiB = 1 << 20


@dataclass(frozen=True)
class AheadSettings:
    """The ``IMGPACK_REMOTE_*`` knobs of reading ahead; ``requests=0`` turns it off."""

    ahead_bytes: int = 256 * MiB
    requests: int = 8
    merge_gap: int = 1 * MiB
    request_bytes: int = 8 * MiB

    @property
    def enabled(self) -> bool:
        return self.requests > 0 and self.ahead_bytes > 0


KNOBS = {  # environment variable: (field, lowest value)
    "IMGPACK_REMOTE_AHEAD_BYTES": ("ahead_bytes", 0),
    "IMGPACK_REMOTE_REQUESTS": ("requests", 0),
    "IMGPACK_REMOTE_MERGE_GAP": ("merge_gap", 0),
    "IMGPACK_REMOTE_REQUEST_BYTES": ("request_bytes", 1),
}
SUFFIXES = {"k": 1 << 10, "m": MiB, "g": 1 << 30}


def parse_size(raw: str) -> int:
    """``"256M"``, ``"64k"``, ``"1048576"``: a byte count (ValueError if not one)."""
    text = raw.strip().lower().removesuffix("ib").removesuffix("b")
    scale = SUFFIXES.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in SUFFIXES else text
    return int(number) * scale


def ahead_settings(environ: Any = None) -> AheadSettings:
    """The settings from the environment, each unset knob at its default; a bad value is an OptionError."""
    environ = os.environ if environ is None else environ
    values: dict[str, int] = {}
    for name, (field, lowest) in KNOBS.items():
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            value = parse_size(raw) if field != "requests" else int(raw)
        except ValueError:
            value = lowest - 1
        if value < lowest:
            unit = "a count of requests" if field == "requests" else "a byte count such as 8M or 1048576"
            raise OptionError(
                f"{name}={raw!r}: must be {unit}, at least {lowest} (unset it for the default "
                f"{getattr(AheadSettings, field)}); see docs/object-storage.md"
            )
        values[field] = value
    return AheadSettings(**values)


# -- fetching -----------------------------------------------------------------------------------
class RangeFetcher:
    """Planned byte ranges fetched ahead on helper threads; ``take`` serves them in the planned order.

    ``reads`` are the planned reads; with ``owners`` (the worker making each read) they are the
    whole rank's and this process serves only those of worker ``me``; ``share(requests, serving)``
    gives the spool the rank's workers share (each request fetched by one of them), or None."""

    def __init__(
        self,
        reads: Any,
        fetch: Callable[[int, int, int], bytes],
        settings: AheadSettings,
        where: Callable[[int], str] = str,
        owners: np.ndarray | None = None,
        me: int = 0,
        share: Callable[[list[Request], np.ndarray], Any] | None = None,
    ):
        self.fetch = fetch
        self.where = where  # a shard's URL, for errors
        self.settings = settings
        table = as_table(reads)
        self.requests, serving = plan_requests(table, settings)
        mine = np.arange(len(table)) if owners is None else np.flatnonzero(np.asarray(owners) == me)
        self.serving = serving[mine].tolist()  # of this process's reads, in order
        uses = np.bincount(serving[mine], minlength=len(self.requests)).tolist()
        for request, count in zip(self.requests, uses):
            request.uses = count
        self.needed = np.flatnonzero(uses).tolist()  # the requests this process reads from
        self.spool = None if share is None else share(self.requests, serving)
        self.planned_bytes = int((table[mine, 2] - table[mine, 1]).sum())
        self.waiting: dict[tuple[int, int, int], deque[int]] = {}
        for j, key in enumerate(map(tuple, table[mine].tolist())):
            self.waiting.setdefault(key, deque()).append(j)
        self.next_read = 0  # planned reads before it are served or passed over
        self.done = bytearray(len(self.serving))  # 1: served, or passed over (then read directly if asked)
        self.next_submit = 0
        self.held = 0  # bytes of requests submitted and not yet dropped
        self.peak = 0
        self.fetched_bytes = 0  # fetched from the server by this process
        self.in_flight = 0
        self.lock = threading.RLock()  # a fetch done at once runs its callback in the submitting thread
        self.pool = ThreadPoolExecutor(max(1, settings.requests), thread_name_prefix="imgpack-ahead")
        self.closed = False
        self.pid = os.getpid()  # a forked child has none of its threads: it reads directly
        self._pump()

    def _pump(self, force: int = -1) -> None:
        """Submit the next requests while the in-flight and byte limits allow (and, whatever the
        limits, those up to request ``force``, which the consumer waits for)."""
        with self.lock:
            while self.next_submit < len(self.requests) and not self.closed:
                index = self.next_submit
                request = self.requests[index]
                if request.uses == 0:  # every read it served was passed over
                    self.next_submit += 1
                    continue
                fits = self.held + request.size <= self.settings.ahead_bytes or self.held == 0
                if index > force and not (fits and self.in_flight < self.settings.requests):
                    break
                self.held += request.size
                self.in_flight += 1
                self.peak = max(self.peak, self.held)
                self.next_submit += 1
                request.future = self.pool.submit(self._obtain, index)
                request.future.add_done_callback(self._done)

    def _obtain(self, index: int) -> Any:
        """Request ``index``'s bytes: from the server, or through the spool (fetched by whichever
        worker of the rank claims it first)."""
        request = self.requests[index]

        def fetch() -> bytes:
            data = self.fetch(request.shard, request.start, request.end)
            with self.lock:
                self.fetched_bytes += len(data)
            return data

        if self.spool is None:
            return fetch()
        return self.spool.obtain(index, fetch, call_bound() * 2, self.where(request.shard))

    def _done(self, _: Future) -> None:
        with self.lock:
            self.in_flight -= 1
        self._pump()

    def take(self, shard: int, start: int, end: int) -> memoryview | None:
        """Bytes [start, end) of ``shard`` if a planned read (waiting for its request), else None."""
        queue = self.waiting.get((shard, start, end))
        if not queue or self.closed or self.pid != os.getpid():
            return None
        k = queue.popleft()
        with self.lock:
            if self.done[k]:  # passed over earlier: its buffer may be gone
                return None
            for passed in range(self.next_read, k):  # planned but not asked for yet: let them go
                if not self.done[passed]:
                    self.done[passed] = 1
                    self._used(self.serving[passed])
            self.done[k] = 1
            self.next_read = max(self.next_read, k + 1)
        index = self.serving[k]
        request = self.requests[index]
        if request.future is None:
            self._pump(force=index)
        assert request.future is not None
        try:
            data = request.future.result(timeout=call_bound() * 2)  # each fetch is bounded by itself
        except TimeoutError:
            raise RemoteError(
                f"{self.where(shard)}: reading ahead: no answer from the server for {call_bound() * 2:g} s; "
                f"the server is stalled or unreachable (${CALL_BOUND_ENV} sets this bound)"
            ) from None
        finally:
            with self.lock:
                self._used(index)
        self._pump()
        return memoryview(data)[start - request.start : end - request.start]  # no copy

    def _used(self, index: int) -> None:
        request = self.requests[index]
        request.uses -= 1
        if request.uses == 0:
            if request.future is not None:
                self.held -= request.size
                request.future = None  # its buffer goes with the last reference
            if self.spool is not None:
                self.spool.done_with(index)

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)  # a stalled fetch ends by its own bound
        if self.spool is not None and self.pid == os.getpid():
            self.spool.close(self.needed)


class PartFetcher:
    """Whole parts downloaded into the cache ahead of the reader, in the order the pass first
    needs them: up to ``settings.requests`` at once (a shuffled pass's first batch needs every
    part of its first shuffle window), within ``settings.ahead_bytes`` of parts downloaded or
    downloading that the reader has not opened yet."""

    def __init__(self, reader: Any, shards: Sequence[int], settings: AheadSettings):
        self.reader = reader
        self.shards = list(shards)
        self.settings = settings
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(max(1, settings.requests), thread_name_prefix="imgpack-parts")
        self.thread = threading.Thread(target=self._run, name="imgpack-parts-ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        entries = self.reader.manifest.shards
        ahead: list[int] = []  # submitted, not yet opened by the reader
        for position in self.shards:
            while not self.stop.is_set():
                opened = self.opened()
                ahead = [p for p in ahead if p not in opened]  # the reader has caught up with it
                waiting = sum(entries[p].bytes for p in ahead)
                if not ahead or waiting + entries[position].bytes <= self.settings.ahead_bytes:
                    break
                self.stop.wait(0.05)
            if self.stop.is_set():
                return
            if position in self.opened():
                continue
            try:
                self.pool.submit(self._download, entries[position])
            except RuntimeError:  # closed meanwhile
                return
            ahead.append(position)

    def _download(self, entry: Any) -> None:
        if self.stop.is_set():
            return
        try:
            self.reader.local_file(entry)
        except Exception:  # noqa: BLE001 - the reader meets the same failure and reports it
            self.stop.set()  # and nothing more is fetched for a pass that is failing
            return
        try:
            self.reader.fetch_sidecars(entry)  # its index: else fetched one part at a time on opening
        except Exception:  # noqa: BLE001 - the opening fetches it again and reports what is wrong
            pass

    def opened(self) -> dict[Any, Any]:
        """The parts the reader has opened in this process."""
        reader = self.reader
        return reader._handles if reader._pid == os.getpid() else {}

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=False, cancel_futures=True)  # a download under way ends by its own bound


@contextmanager
def parts_ahead(reader: Any, shards: Sequence[int], settings: AheadSettings) -> Iterator[None]:
    """While it lasts, ``reader``'s parts ``shards`` are downloaded into its cache ahead of its reads."""
    fetcher = PartFetcher(reader, shards, settings)
    try:
        yield
    finally:
        fetcher.close()


@contextmanager
def ranges_ahead(
    reader: Any, planned: list[np.ndarray], settings: AheadSettings, rank: RankPlan | None = None
) -> Iterator[None]:
    """While it lasts, the byte ranges of ``reader.read_many(planned[i])`` are fetched ahead and
    ``reader.ahead`` serves them. ``reader``: ``handle(position)`` opens a shard (``read(offset,
    length)``), ``byte_range(handle, a, b)`` is where local records [a, b) of a shard lie. With a
    ``rank`` plan the rank's DataLoader workers share what they fetch through a spool."""
    if reader.ahead is not None and reader.ahead.pid == os.getpid():  # a second pass at once here: direct
        yield
        return
    groups = planned if rank is None else rank.planned
    open_shards(reader, groups, settings)
    reads, group = read_ranges(reader, groups)
    owners = np.zeros(len(reads), dtype=np.int64) if rank is None else rank.workers[group]

    def fetch(position: int, start: int, end: int) -> bytes:
        return reader.handle(position).read(start, end - start)

    entries = reader.manifest.shards
    share = None
    if rank is not None:
        share = lambda requests, serving: rank_spool(reader, requests, serving, owners, rank, settings)  # noqa: E731
    fetcher = RangeFetcher(
        reads, fetch, settings, lambda position: reader.location(entries[position].file),
        owners=None if rank is None else owners, me=0 if rank is None else rank.me, share=share,
    )  # fmt: skip
    reader.ahead = fetcher
    try:
        yield
    finally:
        reader.ahead = None
        fetcher.close()


def open_shards(reader: Any, groups: list[np.ndarray], settings: AheadSettings) -> None:
    """Open the shards ``groups`` read (each shard's index: one request each, in parallel)."""
    shards = part_order(reader, groups)
    with ThreadPoolExecutor(max(1, min(settings.requests, len(shards))), "imgpack-open") as pool:
        list(pool.map(reader.handle, shards))


def rank_spool(
    reader: Any,
    requests: list[Request],
    serving: np.ndarray,
    owners: np.ndarray,
    rank: RankPlan,
    settings: AheadSettings,
) -> Any:
    """The spool the rank's workers share for this pass (None where none can be made). Its name
    is a digest of what is read (the dataset's parts and the rank's requests), so only workers
    that planned the same pass of the same dataset meet in it."""
    from readers.remote._spool import Spool, spool_root

    pairs = np.unique(serving.astype(np.int64) * rank.num_workers + owners)  # (request, worker) once each
    needers = np.bincount(pairs // rank.num_workers, minlength=len(requests))
    dataset = hashlib.blake2b(digest_size=6)
    dataset.update(str(reader.root).encode())
    dataset.update("".join(s.sha256 or s.file for s in reader.manifest.shards).encode())
    plan = hashlib.blake2b(digest_size=8)
    plan.update(np.array([(r.shard, r.start, r.end) for r in requests], dtype=np.int64).tobytes())
    plan.update(needers.tobytes())
    stream = f"{rank.tag}-{dataset.hexdigest()}"
    root = spool_root(2 * settings.ahead_bytes)
    return Spool.open(root, rank.owner, stream, plan.hexdigest(), needers, rank.num_workers)


# -- the pass -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankPlan:
    """What every DataLoader worker of a rank reads in a pass: each group's sample indices in the
    order the rank needs them (by position), the worker reading each, which worker this process
    is, and the rank's main process (the owner of the spool its workers share)."""

    planned: list[np.ndarray]
    workers: np.ndarray
    me: int
    owner: int
    num_workers: int
    tag: str = ""  # the stream's (``EpochStream.spool_tag``)

    def mine(self) -> list[np.ndarray]:
        return [p for p, w in zip(self.planned, self.workers.tolist()) if w == self.me]

    def mapped(self, to: Callable[[np.ndarray], np.ndarray]) -> RankPlan:
        """The same plan with each group's indices mapped (a view's into its parent's)."""
        return dataclasses.replace(self, planned=[to(p) for p in self.planned])


@contextmanager
def fetching_ahead(stream: Any, epoch: int, positions: np.ndarray, groups: list) -> Iterator[None]:
    """While a pass of ``stream`` over ``groups`` runs: each remote reader it reads fetches ahead.
    With several DataLoader workers each plans the whole rank's reads, so that they share what
    they fetch (``readers.remote._spool``)."""
    if not remote_readers(stream, epoch, positions) or not (settings := ahead_settings()).enabled:
        yield
        return
    running = stream._pass
    everyone = stream.rank_groups(len(positions)) if running is not None and running.num_workers > 1 else None
    me = running.worker if everyone is not None else 0
    with ExitStack() as stack:
        for reader, rank in rank_plans(stream, epoch, positions, everyone or [groups], me, os.getppid()):
            if everyone is None:
                stack.enter_context(reader.fetch_ahead(rank.planned, settings))
            else:
                stack.enter_context(reader.fetch_ahead(rank.mine(), settings, rank))
        yield


def rank_plans(
    stream: Any, epoch: int, positions: np.ndarray, everyone: list[list], me: int, owner: int
) -> list[tuple[Any, RankPlan]]:
    """(remote reader, what the rank reads from it) for each remote reader a pass of ``stream``
    reads, where ``everyone[w]`` are the groups DataLoader worker ``w`` of the rank emits (one
    list: the process reads the whole rank). ``me``: this process's worker; ``owner``: the rank's
    main process."""
    plans: dict[int, tuple[Any, list[tuple[int, int, np.ndarray]]]] = {
        id(r): (r, []) for r in remote_readers(stream, epoch, positions)
    }
    for worker, worker_groups in enumerate(everyone):
        for group in worker_groups:
            wanted = stream.group_positions(epoch, positions, group)
            for reader, indices in stream.planned_reads(epoch, wanted):
                if id(reader) in plans:
                    plans[id(reader)][1].append((group[0][0], worker, indices))
    out = []
    tag = getattr(stream, "spool_tag", "")
    for reader, entries in plans.values():
        entries.sort(key=lambda entry: entry[0])  # the rank's order: by position
        readers_of = np.array([e[1] for e in entries], dtype=np.int64)
        out.append((reader, RankPlan([e[2] for e in entries], readers_of, me, owner, len(everyone), tag)))
    return out


def remote_readers(stream: Any, epoch: int, positions: np.ndarray) -> list[Any]:
    """The readers behind a URL that a pass of ``stream`` over ``positions`` reads."""
    return [r for r, _ in stream.planned_reads(epoch, positions) if getattr(r, "parts", None) is not None]


def part_order(reader: Any, planned: list[np.ndarray]) -> list[int]:
    """The reader's shard positions in the order ``planned`` reads first need them."""
    if not planned or not sum(len(p) for p in planned):
        return []
    index = np.concatenate([np.asarray(p, dtype=np.int64) for p in planned])
    firsts = np.array([s.first for s in reader.manifest.shards], dtype=np.int64)
    shard = np.searchsorted(firsts, index, side="right") - 1
    positions, first = np.unique(shard, return_index=True)
    return positions[np.argsort(first)].tolist()
