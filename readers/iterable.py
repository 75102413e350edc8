"""``open_iterable``: sequential, sharded, deterministic and resumable reading.

Which samples a rank and a DataLoader worker read, and in what order, is decided in
``readers.order``; this module only reads those records and decodes them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from readers.batch import BatchAssembler, Crop, Size
from readers.batch_check import check_batch_sizes
from readers.decode import OUTPUT_KINDS, decode_record, to_output
from readers.formats import open_reader
from readers.order import OrderSpec, num_chunks, resolve_rank, worker_chunks
from readers.resume import Pass, ResumeError, ResumePoint, advance, check_state, make_state
from readers.whole_batch import whole_batch


class PackedIterable(IterableDataset):
    """Reads a packed dataset as a stream of samples, or of whole batches when ``batch_size`` is set.

    With ``batch_size`` the workers assemble batches and the DataLoader must run with
    ``batch_size=None``: ``DataLoader(it, batch_size=None, num_workers=N)``. Batches are
    uint8 ``(B, C, H, W)`` (``layout="CHW"``, channels_last strides) or ``(B, H, W, C)`` and int64
    labels, built in shared memory; ``crop``, ``size``, ``decode_threads`` and ``fast_dct`` say
    how (see ``readers.batch``). ``transform`` is applied to each image, so only without
    ``batch_size``; with it, ``batch_transform`` is applied to each whole batch's images.

    Without ``batch_size`` (the per-sample path) the DataLoader batches samples itself; pass its
    batch size as ``loader_batch_size`` (``readers.make_loader`` does) so the workers take turns by
    whole batches and the order is the same for any ``num_workers``.

    Resuming: see ``readers.resume`` for the state and its rules.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        shuffle: bool = True,
        seed: int = 0,
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        block_size: int = 64,
        buffer_size: int = 4096,
        decode: str = "tensor",
        transform: Callable | None = None,
        target_transform: Callable | None = None,
        layout: str = "CHW",
        verify: bool = False,
        reader_options: dict[str, Any] | None = None,
        crop: Crop = None,
        size: Size = None,
        decode_threads: int = 0,
        fast_dct: bool = False,
        dct_scaling: bool = True,
        flip: bool | float = False,
        loader_batch_size: int | None = None,
        batch_transform: Callable | None = None,
    ):
        if decode not in OUTPUT_KINDS:
            raise ValueError(f"decode={decode!r}; use one of {', '.join(OUTPUT_KINDS)}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if batch_size is None and decode_threads:
            raise ValueError("decode_threads= applies to whole batches: also pass batch_size=")
        if batch_size is not None and transform is not None:
            raise ValueError(
                "transform= is applied to each image, but with batch_size= the workers build whole "
                "(B, C, H, W) batches: pass batch_transform= for a function of the whole batch (one "
                "call, e.g. normalisation), or drop batch_size= to transform each image"
            )
        if batch_size is None and batch_transform is not None:
            raise ValueError("batch_transform= applies to whole batches: also pass batch_size=")
        if batch_size is not None and loader_batch_size is not None:
            raise ValueError(
                "loader_batch_size= is for the per-sample path; with batch_size= the DataLoader must "
                "run with batch_size=None"
            )
        self.path = path
        self.reader = open_reader(path, verify=verify, **(reader_options or {}))
        rank, world_size = resolve_rank(rank, world_size)
        self.batch_size = batch_size
        self.order = OrderSpec(
            len(self.reader), shuffle, seed, block_size, buffer_size, rank, world_size, drop_last
        )
        self.set_loader_batch_size(loader_batch_size)
        self.decode = decode
        self.transform = transform
        self.batch_transform = batch_transform
        self.target_transform = target_transform
        self.layout = layout
        # Batch options (crop, size, decode threads): see readers.batch.
        self.assembler = BatchAssembler(layout, crop, size, decode_threads, fast_dct, dct_scaling, flip, seed)
        if batch_size is not None:
            check_batch_sizes(str(path), self.reader.manifest.stored_sizes, crop, size)
        # Per-sample path with crop/size/flip: each image goes through the batch geometry.
        self._geometric = crop is not None or size is not None or self.assembler.augment.active
        if batch_size is None and self._geometric and decode == "bytes":
            raise ValueError("crop=, size= and flip= need decoded images: decode='tensor', 'numpy' or 'pil'")
        # Shared with worker processes (fork and spawn), so persistent workers see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        # Samples worker processes have yielded: lets state_dict() in the main process tell
        # "nothing read yet" from "read in workers, which it cannot see".
        self._worker_yields = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._resume: ResumePoint | None = None  # set by load_state_dict, used by the next iteration
        self._pass: Pass | None = None  # the iteration running in this process

    def set_loader_batch_size(self, loader_batch_size: int | None) -> None:
        """The DataLoader's batch size on the per-sample path (workers take turns by that many)."""
        if loader_batch_size is not None and loader_batch_size < 1:
            raise ValueError(f"loader_batch_size must be a positive integer, got {loader_batch_size}")
        self.loader_batch_size = loader_batch_size
        unit = self.batch_size or loader_batch_size or 1
        self.order = dataclasses.replace(self.order, unit=unit)

    # -- epoch, length, resume ----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read. A pending resume point survives only if it names this epoch."""
        self._epoch.fill_(int(epoch))
        if self._resume is not None and self._resume.epoch != int(epoch):
            self._resume = None
        self._pass = None
        self._worker_yields.zero_()

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    @property
    def num_samples(self) -> int:
        """Samples this rank reads in the current epoch (what is left of it after a resume)."""
        resume = self._pending_resume()
        if resume is None:
            return self.order.samples_per_rank
        return self.order.samples_from(resume.position) - resume.offset

    def __len__(self) -> int:
        """Batches for this rank when ``batch_size`` is set, else samples (what is left after a resume)."""
        if self.batch_size is None:
            return self.num_samples
        return num_chunks(self.num_samples, self.batch_size, self.order.drop_last)

    def _pending_resume(self) -> ResumePoint | None:
        resume = self._resume
        return resume if resume is not None and resume.epoch == self.epoch else None

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, as a plain dict to save with a checkpoint.

        In a DataLoader worker this is that worker's state (the protocol of torchdata's
        ``StatefulDataLoader``, which calls it). In the process that iterates (``num_workers=0``)
        it is exact with no argument. With a plain ``DataLoader`` and workers, pass ``consumed``:
        the samples this rank has taken from the loader since the current ``iter(loader)`` began.
        """
        info = get_worker_info()
        if info is not None:
            if self._pass is None:
                return self._state(self._pending_resume() or self._start_point())
            return self._state(self._pass.worker_state())
        if consumed is None:
            if self._pass is not None:
                return self._state(self._pass.reached(self.order))
            if int(self._worker_yields.item()) > 0:
                raise ResumeError(
                    "state_dict() cannot see what DataLoader workers have read: use "
                    "readers.make_loader (a StatefulDataLoader) and loader.state_dict(), or pass "
                    "consumed=<samples taken from the loader since iter(loader) began>"
                )
            return self._state(self._pending_resume() or self._start_point())
        start = self._pending_resume() or self._start_point()
        return self._state(advance(self.order, start, int(consumed)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (from ``state_dict`` or ``loader.state_dict()``): the next
        iteration of that epoch yields exactly what an uninterrupted run would have yielded next."""
        in_worker = get_worker_info() is not None
        point = check_state(state, self.order, in_worker)
        if not in_worker:  # a worker's state must not move the epoch the main process chose
            self._epoch.fill_(point.epoch)
        self._resume = point
        self._pass = None
        self._worker_yields.zero_()

    def _start_point(self) -> ResumePoint:
        return ResumePoint(self.epoch, 0, 0)

    def _state(self, point: ResumePoint) -> dict[str, Any]:
        return make_state(point, self.order)

    # -- iteration ----------------------------------------------------------------------------
    def _label(self, label: int) -> Any:
        return self.target_transform(label) if self.target_transform is not None else label

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch
        start = self._pending_resume() or self._start_point()
        self._resume = None  # used up by this iteration (persistent workers must not reuse it)
        skip = start.worker_skip(worker, workers)
        self._pass = Pass(epoch, ResumePoint(epoch, start.position, start.offset), worker, workers, skip)
        positions = self.order.epoch_order(epoch, start.position)
        spans = trimmed(worker_chunks(len(positions), self.order.unit, worker, workers, False), start.offset)
        if skip:
            spans = trimmed(spans, skip, relative=True)
        if info is not None:
            self._worker_yields.fill_(1)
        # Read a worker's next few chunks together, so per-sample chunks still read in blocks.
        group = max(1, self.order.block_size // self.order.unit)
        pending: list[tuple[int, int]] = []
        for span in spans:
            pending.append(span)
            if len(pending) >= group:
                yield from self._emit(positions, pending)
                pending = []
        yield from self._emit(positions, pending)

    def _emit(self, positions: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Any]:
        if not spans:
            return
        wanted = np.concatenate([positions[a:b] for a, b in spans])
        records = self.reader.read_many(wanted)
        epoch = self._pass.epoch  # random crops and flips: a function of (seed, epoch, sample index)
        cursor = 0
        for a, b in spans:
            part = records[cursor : cursor + (b - a)]
            cursor += b - a
            if self.batch_size is not None:
                self._pass.samples += len(part)
                indices = positions[a:b]
                if self.batch_transform is None:
                    yield whole_batch(self.assembler.shared(part, indices, epoch))  # (images, labels) later
                else:
                    images, labels = self.assembler(part, indices=indices, epoch=epoch)
                    yield whole_batch((self.batch_transform(images), labels))
            else:
                for record, index in zip(part, positions[a:b]):
                    if self._geometric:
                        image = to_output(self.assembler.one(record, index, epoch), self.decode)
                    else:
                        image = decode_record(record, self.decode)
                    if self.transform is not None:
                        image = self.transform(image)
                    self._pass.samples += 1
                    yield image, self._label(record.label)


def trimmed(spans: Iterator[tuple[int, int]], skip: int, relative: bool = False) -> Iterator[tuple[int, int]]:
    """``spans`` without their first positions: those below ``skip`` (absolute), or the first
    ``skip`` positions they cover (``relative``)."""
    for a, b in spans:
        cut = min(b, a + skip) if relative else max(a, min(b, skip))
        if relative:
            skip -= cut - a
        if cut < b:
            yield cut, b


def open_iterable(path: str | os.PathLike, *args: Any, **kwargs: Any) -> PackedIterable:
    """An ``IterableDataset`` over the packed dataset at ``path``; arguments as ``PackedIterable``."""
    return PackedIterable(path, *args, **kwargs)
