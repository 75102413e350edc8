"""Batch buffers in shared memory that a DataLoader worker reuses once the main process is done.

Handing a fresh shared-memory tensor from a worker to the main process costs, per batch, a new
shared-memory file, a file descriptor passed over a socket (which needs the worker's GIL), a new
``mmap`` and page faults on every page on both sides: several times the cost of copying raw pixels.
So each worker process keeps a small ring of shared buffers, and the main process keeps them mapped:

- the first time a slot is used its storage travels with the batch (torch's fd sharing); after that
  a batch is sent as a tiny ``Lease`` (ring token, slot, shape, labels) and rebuilt in the main
  process as a tensor over the already-mapped slot, with no copy;
- every rebuilt tensor gets a storage of its own, and when the main process has dropped it (the
  tensor and every view of it: storages are freed exactly when their last user goes), a finalizer
  marks the slot free in a small shared flag array; only then does the worker write into it again;
- a worker that finds no free slot adds one, up to ``MAX_SLOTS``; past that (the consumer keeps
  many batches alive) it falls back to a one-off shared tensor, so correctness never depends on how
  long the consumer keeps its batches. Memory stays bounded at ``MAX_SLOTS`` buffers per worker;
- the main process drops the mappings of rings whose worker process has exited when a new ring
  registers (every epoch with non-persistent workers), so nothing grows over epochs.

Nothing here is used when the dataset is iterated in the main process (``num_workers=0``).
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch

from readers.fields.targets import received
from readers.process import pid_alive

MAX_SLOTS = 8  # per worker; a DataLoader keeps prefetch_factor (make_loader: 4) batches per worker in flight
FREE, BUSY = 0, 1


class WorkerRing:
    """The shared buffers of one worker process (worker side)."""

    def __init__(self, max_slots: int = MAX_SLOTS):
        self.token = int.from_bytes(os.urandom(7), "little")
        self.pid = os.getpid()
        self.flags = torch.zeros(max_slots, dtype=torch.int32).share_memory_()
        self._flags = self.flags.numpy()
        self.slots: list[torch.Tensor] = []  # uint8, one-dimensional, in shared memory
        self.announced: list[bool] = []  # has the main process got this slot's storage yet
        self.flags_sent = False

    def acquire(self, nbytes: int) -> int | None:
        """A free slot of at least ``nbytes`` (marked busy), or None when the ring is full."""
        best = None
        for slot, buffer in enumerate(self.slots):
            if self._flags[slot] == FREE and buffer.numel() >= nbytes:
                if best is None or buffer.numel() < self.slots[best].numel():
                    best = slot
        if best is None and len(self.slots) < len(self._flags):
            best = len(self.slots)
            self.slots.append(shared_buffer(nbytes))
            self.announced.append(False)
        if best is not None:
            self._flags[best] = BUSY
        return best

    def release(self, slot: int) -> None:
        """Give back a slot that was acquired but never sent."""
        self._flags[slot] = FREE

    def lease(self, slot: int, images: torch.Tensor, labels: np.ndarray, fields: dict | None = None) -> Lease:
        """What to yield for ``images`` (a view of ``slot``) so that only metadata is pickled."""
        storage = None if self.announced[slot] else self.slots[slot]
        flags = None if self.flags_sent else self.flags
        self.announced[slot] = True
        self.flags_sent = True
        offset = images.storage_offset()
        return Lease(
            self.token,
            self.pid,
            slot,
            storage,
            flags,
            tuple(images.shape),
            images.stride(),
            offset,
            np.ascontiguousarray(labels, dtype=np.int64).tobytes(),
            fields,
        )


def shared_buffer(nbytes: int) -> torch.Tensor:
    """A one-dimensional uint8 tensor in fresh shared memory. Made in shared memory directly:
    ``torch.empty(n).share_memory_()`` first fills ordinary pages, then copies them over, which
    doubles the page faults of a worker's first batch."""
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


_WORKER_RING: WorkerRing | None = None


def worker_ring() -> WorkerRing:
    """This process's ring (created on first use, and again after a fork).

    Creating it also freezes the garbage collector's view of the objects inherited from the
    parent: a forked worker's first full collection otherwise walks all of them (torch's whole
    heap), writing to every page it touches, and the copy-on-write faults cost 0.3-0.6 s of the
    first batch. Frozen objects are still freed by reference counting; the worker's own objects
    are collected as usual.
    """
    global _WORKER_RING
    if _WORKER_RING is None or _WORKER_RING.pid != os.getpid():
        gc.freeze()
        _WORKER_RING = WorkerRing()
    return _WORKER_RING


class Lease:
    """A batch in a ring slot, as it travels from a worker; unpickles to ``(images, labels)``."""

    __slots__ = ("token", "pid", "slot", "storage", "flags", "shape", "stride", "offset", "labels", "fields")

    def __init__(self, token, pid, slot, storage, flags, shape, stride, offset, labels, fields=None):
        self.token, self.pid, self.slot = token, pid, slot
        self.storage, self.flags = storage, flags
        self.shape, self.stride, self.offset, self.labels = shape, stride, offset, labels
        self.fields = fields  # collated per-sample fields (small), or None

    def __reduce__(self):
        return (
            receive,
            (
                self.token,
                self.pid,
                self.slot,
                self.storage,
                self.flags,
                self.shape,
                self.stride,
                self.offset,
                self.labels,
                self.fields,
            ),
        )


class _MainRing:
    def __init__(self, pid: int, flags: torch.Tensor):
        self.pid = pid
        self.flags_tensor = flags  # keeps the mapping alive
        self.flags = flags.numpy()
        self.slots: dict[int, np.ndarray] = {}


_MAIN_RINGS: dict[int, _MainRing] = {}
STATS = {"leases": 0}  # batches received through a ring slot in this process
_LOCK = threading.Lock()  # the DataLoader's pin-memory thread also unpickles batches


def _register(token: int, pid: int, flags: torch.Tensor | None) -> _MainRing:
    ring = _MAIN_RINGS.get(token)
    if ring is None:
        if flags is None:
            raise RuntimeError("imgpack: a batch arrived from an unknown shared-memory ring")
        for old in [t for t, r in _MAIN_RINGS.items() if r.pid == pid or not pid_alive(r.pid)]:
            del _MAIN_RINGS[old]  # tensors still held by the user keep their memory alive
        ring = _MAIN_RINGS[token] = _MainRing(pid, flags)
    return ring


def _mark_free(flags: np.ndarray, slot: int) -> None:
    flags[slot] = FREE


def receive(
    token, pid, slot, storage, flags, shape, stride, offset, labels, fields=None
) -> tuple[torch.Tensor, Any]:
    """Rebuild a leased batch in the receiving process (called by unpickling)."""
    with _LOCK:
        ring = _register(token, pid, flags)
        if storage is not None:
            ring.slots[slot] = storage.numpy()
        base = ring.slots[slot]
        STATS["leases"] += 1
    # from_numpy gives this batch a storage of its own, so its lifetime is the batch's.
    images = torch.from_numpy(base).as_strided(shape, stride, offset)
    weakref.finalize(images.untyped_storage(), _mark_free, ring.flags, slot)
    label_tensor = torch.from_numpy(np.frombuffer(labels, dtype=np.int64).copy())
    return received(images, label_tensor, fields)


def mapped_rings() -> list[int]:
    """Slots mapped per worker ring in this process (for tests and diagnostics)."""
    return [len(ring.slots) for ring in _MAIN_RINGS.values()]
