"""Map-style access: ``open_dataset`` and a sampler with the iterable path's ordering guarantees."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Sampler

from readers.errors import DecodeError
from readers.fields.field_schema import select, target
from readers.fields.targets import DetectionTarget, with_fields
from readers.fields.targets import sample as detection_sample
from readers.formats import FormatReader, open_reader
from readers.image.decode import decode_record
from readers.order.epoch_order import OrderSpec, resolve_rank
from readers.order.resume import checked_epoch
from readers.spec import ReadSpec
from readers.store.record import Record


class RamCache:
    """Every record's bytes in one NumPy buffer plus offsets.

    Built once in the parent; forked DataLoader workers share its pages copy-on-write (NumPy
    arrays are not touched by reference counting per element, so the pages stay shared).
    """

    def __init__(self, reader: FormatReader, block: int = 1024):
        n = len(reader)
        self.meta = np.zeros((n, 4), dtype=np.int64)  # label, height, width, channels
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        self.encodings: list[str] = []
        chunks = []
        for start in range(0, n, block):
            for i, record in enumerate(reader.read_block(start, min(n, start + block)), start):
                chunks.append(bytes(record.data))
                self.meta[i] = (record.label, record.height, record.width, record.channels)
                self.offsets[i + 1] = self.offsets[i] + len(record.data)
                if not self.encodings or self.encodings[-1] != record.encoding:
                    self.encodings.append(record.encoding)
        self.encoding = self.encodings[0] if len(set(self.encodings)) == 1 else "original"
        self.data = np.frombuffer(b"".join(chunks), dtype=np.uint8)

    def read(self, index: int) -> Record:
        label, height, width, channels = self.meta[index].tolist()
        data = self.data.data[self.offsets[index] : self.offsets[index + 1]]  # ndarray.data: its memoryview
        return Record(data, label, height, width, channels, self.encoding)


class PackedDataset(Dataset):
    """A packed dataset as ``(image, label)`` pairs, like torchvision's ImageFolder."""

    def __init__(self, path: str | os.PathLike, spec: ReadSpec):
        """``spec``: ``ReadSpec.build("open_dataset", options)`` (``open_dataset`` builds it)."""
        self.path = path
        self.spec = spec
        self.reader = open_reader(path, **spec.open_options)
        self.decode = spec.decode
        self.transform = spec.transform
        self.target_transform = spec.target_transform
        self.classes: list[str] = list(self.reader.manifest.classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.cache = RamCache(self.reader) if spec.cache == "ram" else None
        # With fields=: the target is {"label": ..., field: value, ...} (readers/fields/field_schema.py).
        self.fields = None if spec.fields is None else select(self.manifest.fields, spec.fields, str(path))
        # With target="torchvision": (image, detection target) samples (readers/fields/targets.py).
        self.target = None
        if spec.target is not None:
            where = str(path)
            self.target = DetectionTarget.of(self.manifest.fields, where, spec.label_offset, 0.0, spec.masks)

    @property
    def manifest(self):
        return self.reader.manifest

    @property
    def targets(self) -> list[int]:
        return self.reader.labels().tolist()

    def __len__(self) -> int:
        return len(self.reader)

    def record(self, index: int) -> Record:
        index = self.reader.check_index(index)
        return self.cache.read(index) if self.cache is not None else self.reader.read(index)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = self.reader.check_index(index)
        record = self.record(index)
        try:
            image = decode_record(record, self.decode)
        except DecodeError as exc:
            raise DecodeError(f"{self.reader.describe(index)}: {exc}") from None
        label: Any = record.label
        if self.fields is not None:
            label = target(record.label, record.fields, self.fields)
        if self.target is not None:
            where = self.reader.describe(index)
            stored = self.target.stored_one(record.fields, record.height, record.width, where)
            extra = label if isinstance(label, dict) else None
            image, label = detection_sample(image, with_fields(stored, extra), self.transform)
        elif self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __repr__(self) -> str:
        return f"PackedDataset({str(self.path)!r}, format={self.manifest.format}, samples={len(self)})"


class DeterministicSampler(Sampler[int]):
    """Indices for a map-style dataset in the same order the iterable path uses.

    The order depends only on (seed, epoch, len); each rank gets an equal share (wrapped
    padding, or dropped with ``drop_last``), and the global order is the same for any world size.
    """

    def __init__(
        self,
        data_source_or_len: Any,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        block_size: int = 1,
        buffer_size: int = 0,
    ):
        n = data_source_or_len if isinstance(data_source_or_len, int) else len(data_source_or_len)
        rank, world_size = resolve_rank(rank, world_size)
        self.spec = OrderSpec(n, shuffle, seed, block_size, buffer_size, rank, world_size, drop_last)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = checked_epoch(epoch)

    def __len__(self) -> int:
        return self.spec.samples_per_rank

    def __iter__(self) -> Iterator[int]:
        # Lazily, one Python int at a time: a list of the whole epoch is ~36 bytes per sample.
        return map(int, self.spec.epoch_order(self.epoch))


def open_dataset(
    path: str | os.PathLike,
    *,
    decode: str | None = None,
    transform: Callable | None = None,
    target_transform: Callable | None = None,
    cache: str | None = None,
    verify: bool = False,
    reader_options: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_size: int | None = None,
    fields: Sequence[str] | None = None,
    target: str | None = None,
    label_offset: int = 1,
    masks: bool = False,
) -> PackedDataset:
    """A map-style ``Dataset`` over the packed dataset at ``path``, format read from its manifest.

    The options are ``ReadSpec``'s (readers/spec.py; the table in docs/reading.md), checked the
    same way as on the other entry points. ``path`` may be an fsspec URL (``s3://bucket/ds``) with
    ``storage_options`` for fsspec and a ``cache_dir`` / ``cache_size`` (bytes) for the parts
    downloaded (see readers.remote.remote_parts); ``reader_options`` go to the format's reader.
    ``fields``: per-sample fields to return; the target is then a dict ``{"label": ..., name:
    value}`` (without it: the label, as always). ``target="torchvision"`` (``label_offset``,
    ``masks``): detection targets with boxes in stored pixels, ``transform`` taking ``(image,
    target)`` (readers/fields/targets.py); ``decode`` is "pil" (with ``target=``: "tensor") unless given.
    ``cache="ram"``: every record's bytes read once into memory, shared by forked workers.
    """
    options = {k: v for k, v in locals().items() if k != "path"}
    return PackedDataset(path, ReadSpec.build("open_dataset", options))


__all__ = ["DeterministicSampler", "PackedDataset", "open_dataset"]
