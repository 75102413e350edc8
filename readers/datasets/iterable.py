"""``open_iterable``: sequential, sharded, deterministic and resumable reading of one dataset.

Which samples a rank and a DataLoader worker read, and in what order, is decided in
``readers.order.epoch_order``; what is done with the records (batches, geometry, resume) in
``readers.batch.record_stream``; the options are a ``readers.spec.ReadSpec``. This module only opens
the dataset and reads the records the order asks for.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from readers.batch.record_stream import RecordStream
from readers.bucketing.bucket_plan import bucket_identity, bucket_order, check_bucket_state, sample_sizes
from readers.errors import CallError
from readers.formats import open_reader
from readers.order.epoch_cursor import dataset_identity
from readers.order.quality import warn_if_poorly_mixed
from readers.spec import ReadSpec
from readers.store.record import Record


class PackedIterable(RecordStream):
    """Reads a packed dataset as a stream of samples, or of whole batches when ``batch_size`` is set.

    Every option is keyword-only and is a field of ``readers.spec.ReadSpec`` (the table of
    reading options in docs/reading.md); ``spec=`` passes a ready one instead.

    With ``batch_size`` the workers assemble batches and the DataLoader must run with
    ``batch_size=None``: ``DataLoader(it, batch_size=None, num_workers=N)``. Batches are
    uint8 ``(B, C, H, W)`` (``layout="CHW"``, channels_last strides) or ``(B, H, W, C)`` and int64
    labels, built in shared memory; ``crop``, ``resize``, ``decode_threads`` and ``fast_dct`` say
    how (see ``readers.batch.batch_assembler``). ``transform``, ``target_transform`` and ``decode``
    apply to each sample, so only without ``batch_size`` (an error with it); with it, ``batch_transform`` is
    applied to each whole batch's images. ``size=`` is the deprecated name of ``resize=``.
    ``storage_options``, ``cache_dir`` and ``cache_size`` are for a dataset behind a URL (see
    ``readers.remote.remote_parts``; the same as in ``reader_options``).

    Without ``batch_size`` (the per-sample path) the DataLoader batches samples itself; pass its
    batch size as ``loader_batch_size`` (``readers.make_loader`` does) so the workers take turns by
    whole batches and the order is the same for any ``num_workers``.

    Resuming: see ``readers.order.resume`` for the state and its rules.
    """

    def __init__(self, path: str | os.PathLike, *, spec: ReadSpec | None = None, **options: Any):
        if spec is None:
            spec = ReadSpec.build("open_iterable", options)
        elif options:
            raise CallError("pass either spec= or the reading options, not both")
        self.path = path
        self.reader = open_reader(path, **spec.open_options)
        geometry = spec.geometry([(str(path), self.reader.manifest.stored_sizes)])
        order = spec.order_of(len(self.reader))
        if spec.buckets is not None:  # each sample's bucket, from its stored size
            batch = spec.batch_size or spec.loader_batch_size or 1
            order = bucket_order(spec.buckets, sample_sizes(self.reader), order, batch)
        self.setup(spec, order, geometry)
        warn_if_poorly_mixed(str(path), self.reader, self.order, self.batch_size)

    @property
    def classes(self) -> list[str]:
        return list(self.reader.manifest.classes)

    def identity(self) -> dict[str, Any]:
        return {**dataset_identity(self.reader.manifest), **bucket_identity(self.spec, self.order)}

    def where(self) -> str:
        return str(self.path)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_bucket_state(state, bucket_identity(self.spec, self.order), self.where())
        super().load_state_dict(state)

    def _read(self, epoch: int, positions: np.ndarray) -> list[Record]:
        return self.reader.read_many(positions)

    def planned_reads(self, epoch: int, positions: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        return [(self.reader, np.asarray(positions))]

    def source_readers(self) -> list[Any]:
        return [self.reader]

    def describe(self, position: int) -> str:
        return self.reader.describe(position)

    def field_schemas(self) -> list[dict[str, str]]:
        return [self.reader.manifest.fields]

    def where_fields(self) -> str:
        return str(self.path)


# ``open_iterable(path, *, shuffle=True, seed=0, batch_size=None, ...)``: an ``IterableDataset`` over
# the packed dataset at ``path``; the options are ``readers.spec.ReadSpec``'s.
open_iterable = PackedIterable
