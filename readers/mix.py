"""``readers.mix``: one deterministic, weighted stream over several packed datasets (any formats).

An epoch of a mix has ``epoch_size`` samples (default: the datasets' total). Dataset ``i``
contributes ``round(weight_i / sum(weights) * epoch_size)`` of them (largest remainders, so the
counts add up), interleaved at random: the proportions are exact per epoch and binomial-like
inside any stretch of it. Each dataset is read in its own shuffled order (``readers.order``:
blocks of ``block_size`` consecutive records, so reads stay sequential), continued from epoch
to epoch: a dataset drawn less than its size sees its other samples next epoch; one drawn more
repeats, in a new order per pass. Everything is a function of (seed, epoch) and the datasets'
sizes only; the epoch's sequence is then split across ranks and DataLoader workers exactly like
``open_iterable``'s (``readers.order``), so the result is the
same for any number of workers and the global sequence the same for any world size.

Labels of different datasets are kept apart by an offset: dataset ``i``'s label ``y`` arrives
as ``offsets[i] + y``, where ``offsets`` are the running totals of the datasets' class counts;
``mix.classes`` lists all classes in that order (``"<i>:<name>"``), and ``mix.split_labels``
turns labels back into (dataset index, label within the dataset). ``labels="shared"`` keeps the
labels as they are, for datasets packed with one class list (it must be identical).

With ``batch_size`` the workers assemble whole batches in shared memory (the fast path of
``open_iterable``; records of different datasets must give one output size, or pass
``crop``/``resize``); without it samples are yielded one by one. Options have
``open_iterable``'s names and rules: ``transform`` is per image (without ``batch_size``),
``batch_transform`` per whole batch (with it). Epochs, ``len()`` and resume
(``state_dict``/``load_state_dict``, ``readers.make_loader``) are ``open_iterable``'s
(``readers.stream``), with the datasets' sizes and quotas as part of what a state must match.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from readers.batch import BatchAssembler, Size
from readers.decode import OUTPUT_KINDS, decode_record
from readers.formats import open_reader
from readers.options import check_batch_options
from readers.order import OrderSpec, global_order, resolve_rank
from readers.quality import warn_if_mix_poorly_mixed
from readers.record import Record
from readers.stream import EpochStream

MIX_TAG = 0x6D6978  # "mix": keeps the interleaving stream apart from the datasets' own orders


def quotas(weights: Sequence[float], total: int) -> np.ndarray:
    """Samples per dataset: proportional to ``weights``, summing to ``total`` (largest remainders)."""
    share = np.asarray(weights, dtype=np.float64) / float(np.sum(weights)) * total
    counts = np.floor(share).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(share - counts), kind="stable")[:short]] += 1
    return counts


class MixedIterable(EpochStream):
    """A weighted mix of packed datasets; see the module docstring."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        weights: Sequence[float] | None = None,
        seed: int = 0,
        epoch_size: int | None = None,
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        block_size: int = 64,
        buffer_size: int = 4096,
        labels: str = "offset",
        decode: str = "tensor",
        transform: Callable | None = None,
        layout: str = "CHW",
        crop: Size = None,
        resize: Size = None,
        decode_threads: int = 0,
        reader_options: dict[str, Any] | None = None,
        batch_transform: Callable | None = None,
    ):
        if not paths:
            raise ValueError("mix() needs at least one dataset")
        if weights is None:
            weights = [1.0] * len(paths)
        weights = [float(w) for w in weights]
        if len(weights) != len(paths):
            raise ValueError(f"{len(weights)} weights for {len(paths)} datasets; give one weight per dataset")
        if not all(np.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights {weights} must be finite, >= 0 and not all 0")
        if labels not in ("offset", "shared"):
            raise ValueError(f"labels={labels!r}; use 'offset' or 'shared'")
        if decode not in OUTPUT_KINDS:
            raise ValueError(f"decode={decode!r}; use one of {', '.join(OUTPUT_KINDS)}")
        check_batch_options(
            batch_size,
            decode=decode,
            transform=transform,
            batch_transform=batch_transform,
            decode_threads=decode_threads,
        )
        self.paths = [str(p) for p in paths]
        self.readers = [open_reader(p, **(reader_options or {})) for p in paths]
        self.sizes = [len(r) for r in self.readers]
        empty = [p for p, n in zip(self.paths, self.sizes) if n == 0]
        if empty:
            raise ValueError(f"{empty[0]}: dataset has no samples; leave it out of the mix")
        self.weights = weights
        self.seed = int(seed)
        self.epoch_size = int(epoch_size) if epoch_size is not None else sum(self.sizes)
        self.counts = quotas(weights, self.epoch_size)
        class_lists = [list(r.manifest.classes) for r in self.readers]
        if labels == "shared":
            if any(c != class_lists[0] for c in class_lists):
                raise ValueError("labels='shared' needs datasets with identical classes; use labels='offset'")
            self.offsets = [0] * len(paths)
            self.classes = class_lists[0]
        else:
            self.offsets = np.concatenate([[0], np.cumsum([len(c) for c in class_lists])[:-1]]).tolist()
            self.classes = [f"{i}:{name}" for i, names in enumerate(class_lists) for name in names]
        self.labels = labels
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.drop_last = drop_last
        self.block_size = block_size
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        self.decode = decode
        self.transform = transform
        self.batch_transform = batch_transform
        self.assembler = BatchAssembler(layout, crop, resize, decode_threads)
        # The mixed sequence is already shuffled (epoch_sequence): the order only deals it out.
        self.order = OrderSpec(
            self.epoch_size, False, self.seed, block_size, buffer_size, self.rank, self.world_size, drop_last
        )
        self.set_loader_batch_size(None)
        self.init_stream()
        self._sequence: tuple[int, np.ndarray, np.ndarray] | None = None
        warn_if_mix_poorly_mixed(self)

    # -- the order ----------------------------------------------------------------------------
    def dataset_seed(self, i: int) -> int:
        return int(np.random.SeedSequence([self.seed & 0xFFFFFFFF, i, MIX_TAG]).generate_state(1)[0])

    def epoch_sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, sample index) of every sample of ``epoch``, all ranks together."""
        rng = np.random.default_rng(
            [self.seed & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, self.epoch_size, MIX_TAG]
        )
        source = rng.permutation(np.repeat(np.arange(len(self.readers)), self.counts))
        index = np.empty(self.epoch_size, dtype=np.int64)
        for i, (n, count) in enumerate(zip(self.sizes, self.counts.tolist())):
            stream = np.arange(epoch * count, (epoch + 1) * count, dtype=np.int64)  # dataset i's stream
            picks = np.empty(count, dtype=np.int64)
            for k in np.unique(stream // n).tolist():  # each pass over dataset i has its own order
                order = global_order(
                    n,
                    seed=self.dataset_seed(i),
                    epoch=k,
                    block_size=self.block_size,
                    buffer_size=self.buffer_size,
                )
                here = stream // n == k
                picks[here] = order[stream[here] % n]
            index[source == i] = picks
        return source, index

    def rank_sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (dataset, sample) pairs for ``epoch``."""
        source, index = self.epoch_sequence(epoch)
        mine = self.order.epoch_order(epoch)
        return source[mine], index[mine]

    def identity(self) -> dict[str, Any]:
        return {"counts": self.counts.tolist(), "sizes": list(self.sizes)}

    def split_labels(self, labels: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, label within that dataset) of mixed ``labels`` (``labels="offset"``)."""
        if self.labels != "offset":
            raise ValueError("split_labels needs labels='offset'; shared labels do not say their dataset")
        values = np.asarray(labels, dtype=np.int64)
        dataset = np.searchsorted(np.asarray(self.offsets), values, side="right") - 1
        return dataset, values - np.asarray(self.offsets, dtype=np.int64)[dataset]

    # -- reading ------------------------------------------------------------------------------
    def _records(self, source: np.ndarray, index: np.ndarray) -> list[Record]:
        """Records for the pairs, labels offset; each dataset's share read as a few blocks."""
        out: list[Record | None] = [None] * len(source)
        for i in np.unique(source).tolist():
            where = np.flatnonzero(source == i)
            shift = self.offsets[i]
            for k, record in zip(where.tolist(), self.readers[i].read_many(index[where])):
                out[k] = record._replace(label=record.label + shift) if shift else record
        return out  # type: ignore[return-value]

    def _emit(self, positions: np.ndarray, spans: list[tuple[int, int]]) -> Iterator[Any]:
        assert self._pass is not None
        epoch = self._pass.epoch
        if self._sequence is None or self._sequence[0] != epoch:
            self._sequence = (epoch, *self.epoch_sequence(epoch))
        _, source, index = self._sequence
        take = np.concatenate([positions[a:b] for a, b in spans])
        records = self._records(source[take], index[take])
        cursor = 0
        for a, b in spans:
            part, cursor = records[cursor : cursor + b - a], cursor + b - a
            if self.batch_size is not None:
                self._pass.samples += len(part)
                if self.batch_transform is None:
                    yield self.assembler.shared(part)
                else:
                    images, labels = self.assembler(part)
                    yield self.batch_transform(images), labels
                continue
            for record in part:
                image = decode_record(record, self.decode)
                self._pass.samples += 1
                yield (self.transform(image) if self.transform is not None else image), record.label


# ``mix(paths, weights=None, seed=0, ...)``: a weighted, deterministic mix of packed datasets; the
# signature and the documentation are ``MixedIterable``'s.
mix = MixedIterable
