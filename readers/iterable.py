"""``open_iterable``: sequential, sharded, deterministic and resumable reading.

Which samples a rank and a DataLoader worker read, and in what order, is decided in
``readers.order``; this module only reads those records and decodes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from readers.batch import BatchAssembler, Crop, Size
from readers.decode import OUTPUT_KINDS, decode_record, to_output
from readers.formats import open_reader
from readers.order import OrderSpec, num_chunks, resolve_rank, worker_chunks


class PackedIterable(IterableDataset):
    """Reads a packed dataset as a stream of samples, or of whole batches when ``batch_size`` is set.

    With ``batch_size`` the workers assemble batches and the DataLoader must run with
    ``batch_size=None``: ``DataLoader(it, batch_size=None, num_workers=N)``. Batches are
    uint8 ``(B, C, H, W)`` (``layout="CHW"``, channels_last strides) or ``(B, H, W, C)`` and int64
    labels, built in shared memory; ``crop``, ``size``, ``decode_threads`` and ``fast_dct`` say
    how (see ``readers.batch``).
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
    ):
        if decode not in OUTPUT_KINDS:
            raise ValueError(f"decode={decode!r}; use one of {', '.join(OUTPUT_KINDS)}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if batch_size is None and decode_threads:
            raise ValueError("decode_threads= applies to whole batches: also pass batch_size=")
        self.path = path
        self.reader = open_reader(path, verify=verify, **(reader_options or {}))
        rank, world_size = resolve_rank(rank, world_size)
        self.order = OrderSpec(
            len(self.reader), shuffle, seed, block_size, buffer_size, rank, world_size, drop_last
        )
        self.batch_size = batch_size
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self.layout = layout
        # Batch options (crop, size, decode threads): see readers.batch.
        self.assembler = BatchAssembler(layout, crop, size, decode_threads, fast_dct, dct_scaling, flip, seed)
        # Per-sample path with crop/size/flip: each image goes through the batch geometry.
        self._geometric = crop is not None or size is not None or self.assembler.augment.active
        if batch_size is None and self._geometric and decode == "bytes":
            raise ValueError("crop=, size= and flip= need decoded images: decode='tensor', 'numpy' or 'pil'")
        # Shared with worker processes (fork and spawn), so persistent workers see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._start = 0  # samples of this rank already consumed (resume point)
        self._yielded = 0  # samples yielded by in-process iteration (num_workers=0)

    # -- epoch, length, resume ----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))
        self._start = 0
        self._yielded = 0

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    @property
    def num_samples(self) -> int:
        """Samples this rank reads in a full epoch (with padding, or after drop_last)."""
        return self.order.samples_per_rank

    def __len__(self) -> int:
        """Batches for this rank when ``batch_size`` is set, else samples."""
        if self.batch_size is None:
            return self.num_samples
        return num_chunks(self.num_samples, self.batch_size, self.order.drop_last)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this rank is in the epoch.

        ``consumed`` is the number of samples the training loop has taken from the loader since
        this iteration started (batches x batch size); with ``num_workers=0`` it is counted here
        and may be omitted. A resume point set by ``load_state_dict`` holds until ``set_epoch``.
        """
        done = self._start + (self._yielded if consumed is None else int(consumed))
        return {
            "epoch": self.epoch,
            "consumed": done,
            "seed": self.order.seed,
            "num_samples": self.order.num_samples,
            "world_size": self.order.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_samples", "world_size"):
            mine = getattr(self.order, key)
            if state.get(key, mine) != mine:
                raise ValueError(f"cannot resume: state has {key}={state[key]} but this dataset has {mine}")
        self._epoch.fill_(int(state["epoch"]))
        self._start = int(state["consumed"])
        self._yielded = 0

    # -- iteration ----------------------------------------------------------------------------
    def _label(self, label: int) -> Any:
        return self.target_transform(label) if self.target_transform is not None else label

    def __iter__(self) -> Iterator[Any]:
        self._yielded = 0
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        positions = self.order.epoch_order(self.epoch)[self._start :]
        chunk = self.batch_size or 1
        drop = self.order.drop_last and self.batch_size is not None
        # Read a worker's next few chunks together, so per-sample chunks still read in blocks.
        group = max(1, self.order.block_size // chunk)
        pending: list[tuple[int, int]] = []
        for span in worker_chunks(len(positions), chunk, worker, workers, drop):
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
        epoch = self.epoch  # random crops and flips: a function of (seed, epoch, sample index)
        cursor = 0
        for a, b in spans:
            part = records[cursor : cursor + (b - a)]
            cursor += b - a
            if self.batch_size is not None:
                self._yielded += len(part)
                if self.transform is None:
                    yield self.assembler.shared(part, positions[a:b], epoch)  # (images, labels) in the loop
                else:
                    images, labels = self.assembler(part, indices=positions[a:b], epoch=epoch)
                    yield self.transform(images), labels
            else:
                for record, index in zip(part, positions[a:b]):
                    if self._geometric:
                        image = to_output(self.assembler.one(record, index, epoch), self.decode)
                    else:
                        image = decode_record(record, self.decode)
                    if self.transform is not None:
                        image = self.transform(image)
                    self._yielded += 1
                    yield image, self._label(record.label)


def open_iterable(path: str | os.PathLike, *args: Any, **kwargs: Any) -> PackedIterable:
    """An ``IterableDataset`` over the packed dataset at ``path``; arguments as ``PackedIterable``."""
    return PackedIterable(path, *args, **kwargs)
