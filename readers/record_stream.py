"""The one emission loop: records in, whole batches or single samples out, for every reading path.

``RecordStream`` is ``readers.stream.EpochStream`` (order, rank and worker split, resume) plus what
is done with the records of each span: batch assembly into shared memory (or ``batch_transform``),
the per-sample path through the same geometry, augmentation parameters keyed by the global
position (a function of (seed, epoch, position), so any worker count, rank split or resume draws
the same crops), the collate guard (``readers.whole_batch``), ``pad_last`` and the decode-error
naming. A source (``open_iterable`` over one dataset, ``mix`` over several, the DALI CPU fallback
through ``open_iterable``) only says how many positions an epoch has and which records they are
(``_read``), and builds its stream with ``setup(spec, order)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from readers.batch import BatchAssembler
from readers.decode import decode_record, naming_decode_errors, to_output
from readers.errors import OptionError
from readers.order import OrderSpec
from readers.record import Record
from readers.spec import ReadSpec
from readers.stream import EpochStream
from readers.whole_batch import whole_batch


class RecordStream(EpochStream):
    """An ``EpochStream`` whose subclass supplies records (``_read``) and where they live (``describe``)."""

    spec: ReadSpec

    def setup(self, spec: ReadSpec, order: OrderSpec) -> None:
        if not 0 <= order.rank < order.world_size:
            raise OptionError(f"rank {order.rank} is outside world_size {order.world_size}")
        self.spec = spec
        self.batch_size = spec.batch_size
        self.decode = spec.decode
        self.transform = spec.transform
        self.target_transform = spec.target_transform
        self.batch_transform = spec.batch_transform
        self.layout = spec.layout
        self.assembler = BatchAssembler(
            spec.layout,
            spec.crop,
            spec.resize,
            spec.decode_threads,
            spec.fast_dct,
            spec.dct_scaling,
            spec.flip,
            spec.seed,
        )
        self.order = order
        self.set_loader_batch_size(spec.loader_batch_size)
        self.init_stream()

    # -- what a source supplies ----------------------------------------------------------------
    def _read(self, epoch: int, positions: np.ndarray) -> list[Record]:
        """The records at ``positions`` of ``epoch`` (labels final), in that order."""
        raise NotImplementedError

    def describe(self, position: int) -> str:
        """Where the sample at ``position`` lives, for error messages."""
        raise NotImplementedError

    # -- the loop --------------------------------------------------------------------------------
    def _emit(self, positions: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Any]:
        assert self._pass is not None  # set by the iteration running this
        epoch = self._pass.epoch
        chunks = [self._chunk(epoch, positions, a, b) for a, b in spans]
        wanted = np.concatenate([c for c, _ in chunks])
        records = self._read(epoch, wanted)
        emitted = self._emit_records(records, chunks, epoch)
        yield from naming_decode_errors(emitted, self, wanted, records)

    def _chunk(self, epoch: int, positions: np.ndarray, a: int, b: int) -> tuple[np.ndarray, int]:
        """(positions to read, how many of them count as read) for span [a, b): with ``pad_last``
        a short last batch is filled by wrapping around this rank's order of the epoch (from its
        start, so a resumed pass pads like an uninterrupted one); the padding is not counted."""
        if self.spec.pad_last and self.batch_size is not None and b - a < self.batch_size:
            wrap = np.resize(self.order.epoch_order(epoch), self.batch_size - (b - a))
            return np.concatenate([positions[a:b], wrap]), b - a
        return positions[a:b], b - a

    def _emit_records(
        self, records: list[Record], chunks: list[tuple[np.ndarray, int]], epoch: int
    ) -> Iterator[Any]:
        assert self._pass is not None
        cursor = 0
        for indices, counted in chunks:
            part = records[cursor : cursor + len(indices)]
            cursor += len(indices)
            if self.batch_size is not None:
                self._pass.samples += counted
                if self.batch_transform is None:
                    yield whole_batch(self.assembler.shared(part, indices, epoch))  # (images, labels) later
                else:
                    images, labels = self.assembler(part, indices=indices, epoch=epoch)
                    yield whole_batch((self.batch_transform(images), labels))
                continue
            for record, index in zip(part, indices):
                if self.spec.geometric:
                    image = to_output(self.assembler.one(record, index, epoch), self.decode)
                else:
                    image = decode_record(record, self.decode)
                if self.transform is not None:
                    image = self.transform(image)
                label = record.label if self.target_transform is None else self.target_transform(record.label)
                self._pass.samples += 1
                yield image, label
