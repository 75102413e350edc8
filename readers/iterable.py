"""``open_iterable``: sequential, sharded, deterministic and resumable reading.

Which samples a rank and a DataLoader worker read, and in what order, is decided in
``readers.order``; this module only reads those records and decodes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from readers.batch import BatchAssembler, Crop, Size
from readers.batch_check import check_batch_sizes
from readers.decode import OUTPUT_KINDS, decode_record, naming_decode_errors, to_output
from readers.formats import open_reader
from readers.order import OrderSpec, resolve_rank
from readers.remote_parts import REMOTE_OPTIONS, merge_remote_options
from readers.stream import EpochStream
from readers.whole_batch import whole_batch


class PackedIterable(EpochStream):
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
        self.init_stream()

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    # -- iteration ----------------------------------------------------------------------------
    def _label(self, label: int) -> Any:
        return self.target_transform(label) if self.target_transform is not None else label

    def _emit(self, positions: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Any]:
        wanted = np.concatenate([positions[a:b] for a, b in spans])
        records = self.reader.read_many(wanted)
        emitted = self._emit_records(records, positions, spans)
        yield from naming_decode_errors(emitted, self.reader, wanted, records)

    def _emit_records(self, records: list, positions: np.ndarray, spans: list[tuple[int, int]]):
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


def open_iterable(path: str | os.PathLike, *args: Any, **kwargs: Any) -> PackedIterable:
    """An ``IterableDataset`` over the packed dataset at ``path``; arguments as ``PackedIterable``,
    plus ``storage_options``, ``cache_dir`` and ``cache_size`` for a dataset behind a URL."""
    remote = {key: kwargs.pop(key, None) for key in REMOTE_OPTIONS}
    if any(value is not None for value in remote.values()):
        kwargs["reader_options"] = merge_remote_options(kwargs.get("reader_options"), **remote)
    return PackedIterable(path, *args, **kwargs)
