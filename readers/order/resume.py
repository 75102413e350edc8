"""Mid-epoch resume: the state of an epoch, how it is checked, and how it advances.

An epoch's progress is one global position in that epoch's order (``readers.order.epoch_order`` deals the
order to ranks in rounds, so every rank in lock step has consumed the same prefix), plus, rarely,
an ``offset`` into this rank's next chunk. The state is a plain dict (JSON-able, no pickle):

    {"imgpack_state": 1, "epoch": 3, "position": 1536, "offset": 0,
     "seed": 0, "num_samples": 2000, "shuffle": true, "block_size": 64, "buffer_size": 4096,
     "world_size": 2, "rank": 0, "unit": 64}

The rules, enforced here:

- the order's definition (seed, number of samples, shuffle, block and buffer sizes) must match,
  or the state is refused naming the field;
- a state names its epoch: ``set_epoch`` with that epoch keeps the resume point, another epoch
  drops it; the first iteration of the epoch in each process uses it up;
- a state saved after a pass finished names the next epoch at position 0 (the pass that follows
  is that whole epoch, for any number of DataLoader workers);
- a state names the dataset (``dataset``: ``Manifest.sample_identity``, the pack's order, seed,
  count and classes hashed): another pack of the same images in another order is refused;
- a position resumes with any world size or number of workers (elastic); an ``offset`` or a
  worker's own progress (``worker``, ``num_workers``, ``worker_samples``, written inside
  DataLoader workers for torchdata's ``StatefulDataLoader``) needs the same world size, rank,
  chunk size and number of workers.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from readers.errors import ImgpackError, OptionError
from readers.order.epoch_order import OrderSpec, worker_chunks

STATE_VERSION = 1
ORDER_FIELDS = ("seed", "num_samples", "shuffle", "block_size", "buffer_size")
PLACEMENT_FIELDS = ("world_size", "rank", "unit")
WORKER_FIELDS = ("worker", "num_workers", "worker_samples")
# Which samples the dataset holds at which indices (``Manifest.sample_identity``; a mix: one per
# dataset). States saved before imgpack wrote them lack them and still load.
DATASET_FIELDS = ("dataset", "datasets")
DATASET_VERSION = "dataset_version"  # the manifest version the state was saved on (appends)


class ResumeError(ImgpackError, ValueError):
    """A state that cannot resume this dataset (wrong dataset, wrong seed, out of range...)."""


@dataclass(frozen=True)
class ResumePoint:
    """Where an epoch resumes: a global position, an offset into this rank's next chunk, and
    optionally one DataLoader worker's own progress (``(worker, num_workers, samples)``)."""

    epoch: int
    position: int
    offset: int = 0
    worker_progress: tuple[int, int, int] | None = None

    def worker_skip(self, worker: int, num_workers: int) -> int:
        """Samples of its own share that ``worker`` has already produced."""
        if self.worker_progress is None:
            return 0
        saved_worker, saved_workers, samples = self.worker_progress
        if (saved_worker, saved_workers) != (worker, num_workers):
            raise ResumeError(
                f"this state belongs to DataLoader worker {saved_worker} of {saved_workers}, but it was "
                f"loaded into worker {worker} of {num_workers}; resume with the same num_workers"
            )
        return samples


@dataclass
class Pass:
    """One iteration over an epoch in this process: where it started, what it has yielded."""

    epoch: int
    start: ResumePoint
    worker: int
    num_workers: int
    samples: int = 0  # samples of this process's share yielded (a restored worker's included)

    def worker_state(self) -> ResumePoint:
        return ResumePoint(
            self.epoch, self.start.position, self.start.offset, (self.worker, self.num_workers, self.samples)
        )

    def reached(self, order: OrderSpec) -> ResumePoint:
        """Where this rank stands (only meaningful in the process that reads the whole rank)."""
        return advance(order, self.start, self.samples)


def order_identity(order: OrderSpec) -> dict[str, Any]:
    return {
        "seed": int(order.seed),
        "num_samples": int(order.num_samples),
        "shuffle": bool(order.shuffle),
        "block_size": int(order.block_size),
        "buffer_size": int(order.buffer_size),
        "world_size": int(order.world_size),
        "rank": int(order.rank),
        "unit": int(order.unit),
    }


def make_state(
    point: ResumePoint, order: OrderSpec, identity: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The state dict for ``point``; ``identity``: more fields a resume must match (e.g. a mix's)."""
    state: dict[str, Any] = {
        "imgpack_state": STATE_VERSION,
        "epoch": point.epoch,
        "position": point.position,
        "offset": point.offset,
        **order_identity(order.at_epoch(point.epoch)),
        **(identity or {}),
    }
    if point.worker_progress is not None:
        state.update(zip(WORKER_FIELDS, point.worker_progress, strict=True))
    return state


def advance(order: OrderSpec, start: ResumePoint, samples: int) -> ResumePoint:
    """The point reached after this rank took ``samples`` more samples from ``start``."""
    order = order.at_epoch(start.epoch)
    left = order.samples_from(start.position) - start.offset
    if not 0 <= samples <= left:
        raise ResumeError(
            f"consumed={samples} is outside this iteration, which has {left} samples for this rank; "
            "pass the samples taken from the loader since iter(loader) began"
        )
    done = start.offset + samples
    if samples == left:  # the epoch is over for every rank
        return ResumePoint(start.epoch, order.num_samples, 0)
    chunks, offset = divmod(done, order.unit)
    return ResumePoint(start.epoch, order.position_after(chunks, start.position), offset)


# The order takes an epoch modulo 2**32 (readers.order.epoch_order) and the shared epoch counter is an int64:
# a state beyond that is not one this library wrote.
MAX_EPOCH = 2**32 - 1


def checked_epoch(epoch: Any) -> int:
    """``set_epoch``'s argument as an int in ``0..MAX_EPOCH``, else a one-line ``OptionError``."""
    try:
        value = operator.index(epoch)
    except TypeError:
        raise OptionError(f"set_epoch({epoch!r}): the epoch must be an integer") from None
    if not 0 <= value <= MAX_EPOCH:
        raise OptionError(
            f"set_epoch({value}): the epoch must be within 0..{MAX_EPOCH} (the order takes epochs "
            "modulo 2**32); count epochs from 0"
        )
    return value


def _integer(state: dict[str, Any], key: str, low: int, high: int | None = None, where: str = "") -> int:
    """``state[key]``, which must be an int (not a bool or float) within ``low..high``."""
    value = state[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ResumeError(f"resume state{where} field {key!r} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise ResumeError(f"resume state{where} field {key!r}={value} is outside {bounds}")
    return value


def worker_share(order: OrderSpec, position: int, offset: int, worker: int, num_workers: int) -> int:
    """Samples DataLoader worker ``worker`` of ``num_workers`` produces from (position, offset)."""
    total = order.samples_from(position)
    chunks = worker_chunks(total, order.unit, worker, num_workers, False)
    return sum(b - max(a, min(b, offset)) for a, b in chunks)


def _worker_progress(
    state: dict[str, Any], order: OrderSpec, position: int, offset: int
) -> tuple[int, int, int]:
    missing = [key for key in WORKER_FIELDS if key not in state]
    if missing:
        raise ResumeError(
            f"resume state has {', '.join(k for k in WORKER_FIELDS if k in state)} but not "
            f"{', '.join(missing)}: a worker's fields come together; pass a state from state_dict()"
        )
    num_workers = _integer(state, "num_workers", 1)
    worker = _integer(state, "worker", 0, num_workers - 1)
    share = worker_share(order, position, offset, worker, num_workers)
    return worker, num_workers, _integer(state, "worker_samples", 0, share)


def check_state(
    state: Any, order: OrderSpec, in_worker: bool, identity: dict[str, Any] | None = None, where: str = ""
) -> ResumePoint:
    """The resume point in ``state``, after checking every field against this dataset (named
    ``where`` in messages)."""
    if not isinstance(state, dict):
        raise ResumeError(f"a resume state is a dict from state_dict(), got {type(state).__name__}")
    if "consumed" in state and "position" not in state:
        raise ResumeError(
            "this state comes from an older imgpack (it has 'consumed', not 'position'); its "
            "positions do not carry over: restart the epoch with set_epoch"
        )
    required = ("imgpack_state", "epoch", "position", "offset", *ORDER_FIELDS, *PLACEMENT_FIELDS)
    missing = [key for key in required if key not in state]
    if missing:
        raise ResumeError(f"resume state is missing {', '.join(missing)}; pass a dict from state_dict()")
    for key in (k for k in required if k != "shuffle"):
        _integer(state, key, -(2**63))
    if not isinstance(state["shuffle"], bool):
        raise ResumeError(f"resume state field 'shuffle' must be true or false, got {state['shuffle']!r}")
    if state["imgpack_state"] != STATE_VERSION:
        raise ResumeError(f"resume state version {state['imgpack_state']} is not {STATE_VERSION}")
    _check_version(state, identity or {}, where)
    order = order.at_epoch(_integer(state, "epoch", 0, MAX_EPOCH))  # a length of that epoch's
    mine = order_identity(order)
    for key in ORDER_FIELDS:
        if state[key] != mine[key]:
            raise ResumeError(
                f"cannot resume: the state has {key}={state[key]!r} but this dataset has {mine[key]!r} "
                "(the order of an epoch depends on it)"
            )
    for key, value in (identity or {}).items():
        if key in DATASET_FIELDS:
            _check_dataset(state, key, value, where)
        elif key == DATASET_VERSION:
            continue  # _check_version
        elif state.get(key) != value or type(state.get(key)) is not type(value):
            raise ResumeError(
                f"cannot resume: the state has {key}={state.get(key)!r} but this stream has {value!r}"
            )
    epoch = _integer(state, "epoch", 0, MAX_EPOCH)
    position = _integer(state, "position", 0, order.num_samples)
    world_size = _integer(state, "world_size", 1)
    _integer(state, "rank", 0, world_size - 1)
    _integer(state, "unit", 1)
    progress = None
    if any(key in state for key in WORKER_FIELDS):
        if not in_worker:
            raise ResumeError(
                "this is one DataLoader worker's state (it has 'worker'); load the loader's state with "
                "loader.load_state_dict (StatefulDataLoader) instead"
            )
        progress = True
    offset = state["offset"]
    if offset or progress is not None:
        for key in PLACEMENT_FIELDS:
            if state[key] != mine[key]:
                raise ResumeError(
                    f"cannot resume mid-chunk: the state has {key}={state[key]} but this run has "
                    f"{mine[key]}; resume with the same {key}, or from a state taken at a batch boundary"
                )
    offset = _integer(state, "offset", 0, order.unit - 1)
    worker_progress = _worker_progress(state, order, position, offset) if progress else None
    return ResumePoint(epoch, position, offset, worker_progress)


def _check_version(state: dict[str, Any], identity: dict[str, Any], where: str) -> None:
    """A state names the dataset version it was saved on (none: saved before imgpack wrote it).
    An append changes the sample count, so every epoch's order: resuming across it is not exact."""
    saved, mine = state.get(DATASET_VERSION), identity.get(DATASET_VERSION)
    if saved is None or mine is None or saved == mine:
        return
    raise ResumeError(
        f"cannot resume: the state was saved on version {saved} of the dataset but {where or 'this stream'} "
        f"is version {mine} (an append added samples, which changes the order of every epoch); load the "
        "state into the version it was saved on, or start the next epoch afresh without it"
    )


def _check_dataset(state: dict[str, Any], key: str, mine: Any, where: str) -> None:
    if key not in state or state[key] == mine:
        return
    raise ResumeError(
        f"cannot resume: the state was saved on dataset {state[key]!r} but {where or 'this stream'} "
        f"is dataset {mine!r} (ids are --order:--seed:hash): the same indices hold other samples "
        "there; load the state into the dataset it was saved on, or start afresh without it"
    )


def loader_workers(num_workers: Any) -> int | None:
    """The loader state's own ``num_workers`` (None: not saved), checked."""
    if num_workers is None:
        return None
    return _integer({"num_workers": num_workers}, "num_workers", 0, where=" (the loader's)")


def check_worker_states(
    state: dict[str, Any], workers: int, epoch: int, order: OrderSpec, identity: dict[str, Any]
) -> None:
    """Check the DataLoader workers' own states in a ``StatefulDataLoader`` state (as each
    worker will load them), against the loader's ``num_workers`` and ``epoch``. A worker's
    snapshot is of its last batch, so at an epoch boundary it may name the epoch before the
    loader's (it has not yielded in this one yet) or the one after (it has started the next);
    the worker passes over such a state (readers.datasets.stream). Any other epoch is an error."""
    snapshots = state.get("_snapshot", {}).get("_worker_snapshots") or {}
    if not isinstance(snapshots, dict):
        raise ResumeError("resume state's '_worker_snapshots' is not a mapping; pass loader.state_dict()")
    for name, snapshot in snapshots.items():
        dataset_state = snapshot.get("dataset_state") if isinstance(snapshot, dict) else None
        if dataset_state is None:
            continue
        where = f" of {name}"
        try:
            point = check_state(dataset_state, order, True, identity)
        except ResumeError as exc:
            raise ResumeError(f"{name}: {exc}") from None
        if abs(point.epoch - epoch) > 1:
            raise ResumeError(
                f"resume state{where} field 'epoch'={point.epoch} disagrees with the loader's epoch "
                f"{epoch}; pass the loader.state_dict() saved in one piece"
            )
        if point.worker_progress is not None:
            worker, saved_workers, _ = point.worker_progress
            if saved_workers != workers:
                raise ResumeError(
                    f"resume state{where} field 'num_workers'={saved_workers} disagrees with the "
                    f"loader's num_workers {workers}; pass the loader.state_dict() saved in one piece"
                )
            if name != f"worker_{worker}":
                raise ResumeError(
                    f"resume state{where} field 'worker'={worker} is not that of {name}; "
                    "pass the loader.state_dict() saved in one piece"
                )
