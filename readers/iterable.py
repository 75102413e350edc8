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
from readers.options import check_batch_options, renamed
from readers.order import OrderSpec, resolve_rank
from readers.quality import warn_if_poorly_mixed
from readers.remote_parts import merge_remote_options
from readers.stream import EpochStream
from readers.whole_batch import whole_batch


class PackedIterable(EpochStream):
    """Reads a packed dataset as a stream of samples, or of whole batches when ``batch_size`` is set.

    With ``batch_size`` the workers assemble batches and the DataLoader must run with
    ``batch_size=None``: ``DataLoader(it, batch_size=None, num_workers=N)``. Batches are
    uint8 ``(B, C, H, W)`` (``layout="CHW"``, channels_last strides) or ``(B, H, W, C)`` and int64
    labels, built in shared memory; ``crop``, ``resize``, ``decode_threads`` and ``fast_dct`` say
    how (see ``readers.batch``). ``transform``, ``target_transform`` and ``decode`` apply to each
    sample, so only without ``batch_size`` (an error with it); with it, ``batch_transform`` is
    applied to each whole batch's images. ``size=`` is the deprecated name of ``resize=``.
    ``storage_options``, ``cache_dir`` and ``cache_size`` are for a dataset behind a URL (see
    ``readers.remote_parts``; the same as in ``reader_options``).

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
        resize: Size = None,
        decode_threads: int = 0,
        fast_dct: bool = False,
        dct_scaling: bool = True,
        flip: bool | float = False,
        loader_batch_size: int | None = None,
        batch_transform: Callable | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_size: int | None = None,
        size: Size = None,
    ):
        resize = renamed("open_iterable", "size", size, "resize", resize)
        remote = {"storage_options": storage_options, "cache_dir": cache_dir, "cache_size": cache_size}
        reader_options = merge_remote_options(reader_options, **remote)
        if decode not in OUTPUT_KINDS:
            raise ValueError(f"decode={decode!r}; use one of {', '.join(OUTPUT_KINDS)}")
        check_batch_options(
            batch_size,
            decode=decode,
            transform=transform,
            target_transform=target_transform,
            batch_transform=batch_transform,
            decode_threads=decode_threads,
        )
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
        # Batch options (crop, resize, decode threads): see readers.batch.
        self.assembler = BatchAssembler(
            layout, crop, resize, decode_threads, fast_dct, dct_scaling, flip, seed
        )
        if batch_size is not None:
            check_batch_sizes(str(path), self.reader.manifest.stored_sizes, crop, resize)
        # Per-sample path with crop/resize/flip: each image goes through the batch geometry.
        self._geometric = crop is not None or resize is not None or self.assembler.augment.active
        if batch_size is None and self._geometric and decode == "bytes":
            raise ValueError(
                "crop=, resize= and flip= need decoded images: decode='tensor', 'numpy' or 'pil'"
            )
        self.init_stream()
        warn_if_poorly_mixed(str(path), self.reader, self.order, batch_size)

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
        assert self._pass is not None  # set by the iteration running this
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


# ``open_iterable(path, shuffle=True, seed=0, batch_size=None, ...)``: an ``IterableDataset`` over the
# packed dataset at ``path``; the signature and the documentation are ``PackedIterable``'s.
open_iterable = PackedIterable
