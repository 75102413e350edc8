"""The one emission loop: records in, whole batches or single samples out, for every reading path.

``RecordStream`` is ``readers.datasets.stream.EpochStream`` (order, rank and worker split, resume) plus what
is done with the records of each span: batch assembly into shared memory (or ``batch_transform``),
the per-sample path through the same geometry, augmentation parameters keyed by the global
position (a function of (seed, epoch, position), so any worker count, rank split or resume draws
the same crops), the collate guard (``readers.batch._whole_batch``), ``pad_last`` and the decode-error
naming. A source (``open_iterable`` over one dataset, ``mix`` over several, the DALI CPU fallback
through ``open_iterable``) only says how many positions an epoch has and which records they are
(``_read``), and builds its stream with ``setup(spec, order, spec.geometry(stored sizes))``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from readers.batch._whole_batch import whole_batch
from readers.batch.batch_assembler import BatchAssembler
from readers.bucketing.token_batch import assembler_of
from readers.bucketing.token_order import EMPTY, TokenOrder
from readers.datasets.stream import EpochStream
from readers.errors import OptionError
from readers.fields.sample_fields import FieldPlan, common_schema, per_dataset_schema
from readers.fields.targets import KEY as TARGETS_KEY
from readers.fields.targets import DetectionTarget, received, with_fields
from readers.fields.targets import sample as detection_sample
from readers.image.decode import decode_record, naming_decode_errors, to_output
from readers.image.geometry import Geometry
from readers.order.epoch_order import OrderSpec
from readers.remote.readahead import ReadAhead, planned_extents
from readers.remote.remote_ahead import fetching_ahead
from readers.spec import ReadSpec
from readers.store.record import Record


class RecordStream(EpochStream):
    """An ``EpochStream`` whose subclass supplies records (``_read``) and where they live (``describe``)."""

    spec: ReadSpec

    def setup(self, spec: ReadSpec, order: OrderSpec, geometry: Geometry) -> None:
        """``geometry``: the read's one geometry (``spec.geometry`` of the source's stored sizes)."""
        if not 0 <= order.rank < order.world_size:
            raise OptionError(f"rank {order.rank} is outside world_size {order.world_size}")
        self.spec = spec
        self.batch_size = spec.batch_size
        self.decode = spec.decode
        self.transform = spec.transform
        self.target_transform = spec.target_transform
        self.batch_transform = spec.batch_transform
        self.layout = spec.layout
        self.assembler = assembler_of(spec, order, geometry)  # a token budget's picks each batch's cell
        self.fields = field_plan(spec, self.field_schemas(), self.where_fields(), self.dataset_names())
        self.targets = target_plan(spec, self.field_schemas(), self.where_fields())
        self.order = order
        self.set_loader_batch_size(spec.loader_batch_size)
        self.hints = ReadAhead(int(spec.readahead or 0))
        self.init_stream()

    # -- what a source supplies ----------------------------------------------------------------
    def _read(self, epoch: int, positions: np.ndarray) -> list[Record]:
        """The records at ``positions`` of ``epoch`` (labels final), in that order."""
        raise NotImplementedError

    def describe(self, position: int) -> str:
        """Where the sample at ``position`` lives, for error messages."""
        raise NotImplementedError

    def field_schemas(self) -> list[dict[str, str]]:
        """The field schema ({name: kind}) of each dataset this source reads."""
        return []

    def where_fields(self) -> str:
        return type(self).__name__

    def dataset_names(self) -> list[str]:
        """A name for each dataset of ``field_schemas`` (for error messages)."""
        return [f"dataset {i}" for i in range(len(self.field_schemas()))]

    def record_sources(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Which of the source's datasets each position of ``epoch`` reads (a mix has several)."""
        return np.zeros(len(positions), dtype=np.int64)

    def planned_reads(self, epoch: int, positions: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        """(format reader, sample indices) for each dataset ``_read(epoch, positions)`` reads from."""
        raise NotImplementedError

    def source_readers(self) -> list[Any]:
        """The format reader of each dataset this source reads."""
        raise NotImplementedError

    def group_positions(self, epoch: int, positions: np.ndarray, group: list[tuple[int, int]]) -> np.ndarray:
        """The positions ``_emit(positions, group)`` reads (padding of a short last batch included)."""
        return np.concatenate([self._chunk(epoch, positions, a, b)[0] for a, b in group])

    def read_ahead(self, positions: np.ndarray, groups: list[list[tuple[int, int]]], current: int) -> None:
        if self.hints.enabled and self._pass is not None:
            epoch = self._pass.epoch
            plan = lambda g: planned_extents(self, epoch, positions, groups[g])  # noqa: E731
            self.hints.on_group(self._pass, plan, len(groups), current)

    def prime_pass(self, epoch: int, start: Any, num_workers: int) -> Any:
        if all(getattr(r, "parts", None) is None for r in self.source_readers()):
            return None  # all local: not even the pass's order is needed here
        from readers.remote.prime import prime_pass

        return prime_pass(self, epoch, start, num_workers)

    # -- the loop --------------------------------------------------------------------------------
    def _emit_pass(self, positions: np.ndarray, groups: list[list[tuple[int, int]]]) -> Iterator[Any]:
        """The pass, with each remote dataset it reads fetching ahead (readers/remote/remote_ahead.py)."""
        assert self._pass is not None
        with fetching_ahead(self, self._pass.epoch, positions, groups):
            yield from super()._emit_pass(positions, groups)

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
        if isinstance(self.order, TokenOrder):  # a batch smaller than its slots leaves them EMPTY
            chunk = positions[a:b]
            return chunk[chunk != EMPTY], b - a
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
                fields, params = self._batch_fields(part, indices, epoch)
                if self.batch_transform is None:
                    # (images, labels) once received: the pixels in shared memory, the fields alongside
                    yield whole_batch(self.assembler.shared(part, indices, epoch, fields, params))
                else:
                    images, labels = self.assembler(part, indices=indices, epoch=epoch, params=params)
                    yield whole_batch(received(self.batch_transform(images), labels, fields))
                continue
            for record, index in zip(part, indices):
                if self.spec.geometric:
                    image = to_output(self.assembler.one(record, index, epoch), self.decode)
                else:
                    image = decode_record(record, self.decode)
                if self.targets is not None:
                    image, label = self._detection_sample(image, record, index, epoch)
                else:
                    if self.transform is not None:
                        image = self.transform(image)
                    label = self._fields_target(record, index, epoch)
                if self.target_transform is not None:
                    label = self.target_transform(label)
                self._pass.samples += 1
                yield image, label

    def _fields_target(self, record: Record, index: int, epoch: int) -> Any:
        """A per-sample target: the label, or with ``fields=`` the dict of ``FieldPlan.one``."""
        plan = self.fields
        if plan is None:
            return record.label
        geometry = self._geometries([record], [index], epoch)[0] if plan.wants_geometry else None
        source = None
        if plan.per_dataset is not None:
            source = int(self.record_sources(epoch, np.asarray([index]))[0])
        return plan.one(record.label, record.fields, geometry, source)

    def _detection_sample(self, image: Any, record: Record, index: int, epoch: int) -> tuple[Any, Any]:
        """(image, target) of ``target=`` (readers/fields/targets.py), through the (image, target)
        transform."""
        assert self.targets is not None
        geometry = self._geometries([record], [index], epoch)[0]
        where = self.describe(index) if self.targets.segmentation else ""
        target = self.targets.one(record.fields, geometry, where)
        extra = self._fields_target(record, index, epoch) if self.fields is not None else None
        return detection_sample(image, with_fields(target, extra), self.transform)

    def _geometries(self, records: list[Record], indices: Any, epoch: int) -> list[Any]:
        params = self.assembler.params(records, indices, epoch)
        return self.assembler.sample_geometries(records, params)

    def _batch_fields(
        self, records: list[Record], indices: Any, epoch: int
    ) -> tuple[dict[str, Any] | None, list[Any] | None]:
        """(the batch's collated fields without the label, or None without ``fields=``; the crop
        and flip parameters drawn for the boxes, or None: the assembler draws its own)."""
        plan = self.fields
        if self.targets is not None:
            return self._batch_targets(records, indices, epoch)
        if plan is None:
            return None, None
        sources = self.record_sources(epoch, np.asarray(indices)) if plan.per_dataset is not None else None
        params = self.assembler.params(records, indices, epoch) if plan.wants_geometry else None
        fields = batch_fields(plan, self.assembler, records, params, sources)
        # without random crops or flips the assembler copies raw batches in one go when not given params
        return fields, params if params is not None and self.assembler.augment.active else None


    def _batch_targets(self, records: list[Record], indices: Any, epoch: int) -> tuple[dict[str, Any], Any]:
        """``_batch_fields`` with ``target=``: each sample's NumPy target, shaped where received."""
        assert self.targets is not None
        params = self.assembler.params(records, indices, epoch)
        geometries = self.assembler.sample_geometries(records, params)
        targets = []
        for record, index, geometry in zip(records, indices, geometries):
            target = self.targets.one(record.fields, geometry)
            extra = self._fields_target(record, index, epoch) if self.fields is not None else None
            targets.append(with_fields(target, extra))
        return {TARGETS_KEY: targets}, params if self.assembler.augment.active else None


def field_plan(
    spec: ReadSpec, schemas: list[dict[str, str]], where: str, names: Sequence[str] = ()
) -> FieldPlan | None:
    """The ``FieldPlan`` of ``spec.fields`` (or a mix's ``fields_per_dataset``) over datasets with
    these schemas (``names``: how errors name each dataset); None without either."""
    if spec.fields_per_dataset is not None:
        wanted = spec.fields_per_dataset
        schema = per_dataset_schema(schemas, wanted, where, names)
        return FieldPlan(schema, [], spec.pad_fields, spec.min_visibility, per_dataset=wanted)
    if spec.fields is None:
        return None
    schema = common_schema(schemas, spec.fields, where, names)
    return FieldPlan(schema, spec.fields, spec.pad_fields, spec.min_visibility)


def batch_fields(
    plan: FieldPlan,
    assembler: BatchAssembler,
    records: list[Record],
    params: list[Any] | None,
    sources: Any = None,
) -> dict[str, Any]:
    """A batch's collated fields (without the label), boxes moved by the geometry ``assembler`` gives
    each record with its (window, flip) ``params`` (None: the plan wants no geometry); ``sources``:
    each record's dataset in a mix with ``fields_per_dataset``."""
    geometries = assembler.sample_geometries(records, params) if params is not None else None
    return plan.batch([r.fields for r in records], geometries, sources)


def target_plan(spec: ReadSpec, schemas: list[dict[str, str]], where: str) -> DetectionTarget | None:
    """The ``DetectionTarget`` of ``spec.target`` over datasets with these schemas (one for all)."""
    if spec.target is None:
        return None
    if not schemas:
        raise OptionError(f"{where}: target={spec.target!r} needs a dataset with boxes")
    options = (spec.label_offset, spec.min_visibility, spec.masks)
    plans = {DetectionTarget.of(schema, where, *options) for schema in schemas}
    if len(plans) > 1:
        raise OptionError(f"{where}: target={spec.target!r} needs the same box fields in every dataset read")
    return plans.pop()
