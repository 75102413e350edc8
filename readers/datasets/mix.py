"""``readers.datasets.mix``: one deterministic, weighted stream over several packed datasets (any formats).

An epoch of a mix has ``epoch_size`` samples (default: the datasets' total). Dataset ``i``
contributes ``round(weight_i / sum(weights) * epoch_size)`` of them (largest remainders, so the
counts add up), interleaved at random: the proportions are exact per epoch and binomial-like
inside any stretch of it. Each dataset is read in its own shuffled order (``readers.order.epoch_order``:
blocks of ``block_size`` consecutive records, so reads stay sequential), continued from epoch
to epoch: a dataset drawn less than its size sees its other samples next epoch; one drawn more
repeats, in a new order per pass. Everything is a function of (seed, epoch) and the datasets'
sizes only; the epoch's sequence is then split across ranks and DataLoader workers exactly like
``open_iterable``'s (``readers.order.epoch_order``), so the result is the
same for any number of workers and the global sequence the same for any world size.

Labels of different datasets are kept apart by an offset: dataset ``i``'s label ``y`` arrives
as ``offsets[i] + y`` (-1, a sample without a class, stays -1), where ``offsets`` are the running
totals of the datasets' class counts;
``mix.classes`` lists all classes in that order (``"<i>:<name>"``), and ``mix.split_labels``
turns labels back into (dataset index, label within the dataset). ``labels="shared"`` keeps the
labels as they are, for datasets packed with one class list (it must be identical).

Reading is ``open_iterable``'s by construction (``readers.batch.record_stream``): the same options
(``readers.spec.ReadSpec``: crop, resize, RandomResizedCrop, flip, shuffle, verify, fast_dct,
decode_threads, batch_transform, storage options...), checked the same way when ``mix`` is called
(a crop larger than any dataset's smallest stored image included), the same whole batches in shared
memory (records of different datasets must give one output size, or pass ``crop``/``resize``),
the same per-sample path and collate guard. Augmentation parameters are a function of (seed,
epoch, position in the mixed epoch), so they do not depend on workers, ranks or resume.
``shuffle=False`` reads each dataset in its stored order (the interleaving stays seeded). Epochs,
``len()`` and resume (``state_dict``/``load_state_dict``, ``readers.make_loader``) are
``open_iterable``'s (``readers.datasets.stream``), with the datasets' sizes and quotas as part of what a
state must match.

``buckets=`` (readers/bucketing/buckets.py) gives batches of one bucket each: every position of the mixed
epoch takes the bucket of the sample it holds (from its stored size), and the mixed epoch is cut
into groups of one bucket spread over it (readers/datasets/_mix_order.py, ``MixBucketOrder``): still a
function of (seed, epoch, datasets, weights), the same shape at each step on every rank, exact
and elastic resume; ``leftover`` "pad" or "drop" ("carry" is ``open_iterable``'s).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from readers.batch.record_stream import RecordStream
from readers.bucketing.bucket_plan import bucket_identity, check_bucket_state, sample_sizes
from readers.datasets._mix_order import MixSequence, mix_bucket_order
from readers.errors import CallError, OptionError
from readers.formats import open_reader
from readers.order.epoch_order import resolve_rank
from readers.order.quality import warn_if_mix_poorly_mixed
from readers.spec import ReadSpec, combined_sizes
from readers.store.record import Record


def quotas(weights: Sequence[float], total: int) -> np.ndarray:
    """Samples per dataset: proportional to ``weights``, summing to ``total`` (largest remainders)."""
    share = np.asarray(weights, dtype=np.float64) / float(np.sum(weights)) * total
    counts = np.floor(share).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(share - counts), kind="stable")[:short]] += 1
    return counts


class MixedIterable(RecordStream):
    """A weighted mix of packed datasets; see the module docstring.

    ``weights``, ``epoch_size`` and ``labels`` are the mix's own; every other option is a field of
    ``readers.spec.ReadSpec``, exactly as for ``open_iterable`` (``spec=`` passes a ready one).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        *,
        weights: Sequence[float] | None = None,
        epoch_size: int | None = None,
        labels: str = "offset",
        spec: ReadSpec | None = None,
        **options: Any,
    ):
        if spec is None:
            spec = ReadSpec.build("mix", options)
        elif options:
            raise CallError("pass either spec= or the reading options, not both")
        if not paths:
            raise OptionError("mix() needs at least one dataset")
        if weights is None:
            weights = [1.0] * len(paths)
        weights = [float(w) for w in weights]
        if len(weights) != len(paths):
            raise OptionError(
                f"{len(weights)} weights for {len(paths)} datasets; give one weight per dataset"
            )
        if not all(np.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
            raise OptionError(f"weights {weights} must be finite, >= 0 and not all 0")
        if labels not in ("offset", "shared"):
            raise OptionError(f"labels={labels!r}; use 'offset' or 'shared'")
        self.paths = [str(p) for p in paths]
        self.readers = [open_reader(p, **spec.open_options) for p in paths]
        self.sizes = [len(r) for r in self.readers]
        empty = [p for p, n in zip(self.paths, self.sizes) if n == 0]
        if empty:
            raise OptionError(f"{empty[0]}: dataset has no samples; leave it out of the mix")
        stored = [r.manifest.stored_sizes for r in self.readers]
        geometry = spec.geometry(list(zip(self.paths, stored)))
        spec.check_stored(f"mix of {', '.join(self.paths)}", combined_sizes(stored))
        self.weights = weights
        self.seed = int(spec.seed)
        self.epoch_size = int(epoch_size) if epoch_size is not None else sum(self.sizes)
        self.counts = quotas(weights, self.epoch_size)
        class_lists = [list(r.manifest.classes) for r in self.readers]
        if labels == "shared":
            if any(c != class_lists[0] for c in class_lists):
                raise OptionError(
                    "labels='shared' needs datasets with identical classes; use labels='offset'"
                )
            self.offsets = [0] * len(paths)
            self.classes = class_lists[0]
        else:
            self.offsets = np.concatenate([[0], np.cumsum([len(c) for c in class_lists])[:-1]]).tolist()
            self.classes = [f"{i}:{name}" for i, names in enumerate(class_lists) for name in names]
        self.labels = labels
        self.rank, self.world_size = resolve_rank(spec.rank, spec.world_size)
        self.drop_last = spec.drop_last
        self.block_size = spec.block_size
        self.buffer_size = spec.buffer_size
        counts = tuple(self.counts.tolist())
        self.sequence = MixSequence(self.seed, tuple(self.sizes), counts, self.block_size, self.buffer_size,
                                    spec.shuffle)  # fmt: skip
        # The mixed sequence is already shuffled (epoch_sequence): the order only deals it out.
        order = spec.order_of(self.epoch_size, shuffle=False)
        if spec.buckets is not None:  # each position's bucket, from its sample's stored size
            batch = spec.batch_size or spec.loader_batch_size or 1
            stored_sizes = [sample_sizes(reader) for reader in self.readers]
            order = mix_bucket_order(spec.buckets, stored_sizes, self.sequence, order, batch)
        self.setup(spec, order, geometry)
        warn_if_mix_poorly_mixed(self)

    # -- the order ----------------------------------------------------------------------------
    def dataset_seed(self, i: int) -> int:
        return self.sequence.dataset_seed(i)

    def epoch_sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, sample index) of every sample of ``epoch``, all ranks together."""
        return self.sequence(epoch)

    def rank_sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (dataset, sample) pairs for ``epoch``."""
        source, index = self.epoch_sequence(epoch)
        mine = self.order.epoch_order(epoch)
        return source[mine], index[mine]

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {"counts": self.counts.tolist(), "sizes": list(self.sizes)}
        identity["datasets"] = [r.manifest.sample_identity() for r in self.readers]
        if not self.spec.shuffle:  # only then: states saved before shuffle= existed stay valid
            identity["datasets_shuffled"] = False
        return {**identity, **bucket_identity(self.spec, self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_bucket_state(state, bucket_identity(self.spec, self.order), self.where())
        super().load_state_dict(state)

    def split_labels(self, labels: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, label within that dataset) of mixed ``labels`` (``labels="offset"``);
        a label of -1 (no class) does not say its dataset: (-1, -1) (``fields_per_dataset`` does)."""
        if self.labels != "offset":
            raise OptionError("split_labels needs labels='offset'; shared labels do not say their dataset")
        values = np.asarray(labels, dtype=np.int64)
        dataset = np.searchsorted(np.asarray(self.offsets), values, side="right") - 1
        dataset[values < 0] = -1
        within = values - np.asarray(self.offsets, dtype=np.int64)[np.maximum(dataset, 0)]
        return dataset, np.where(values < 0, -1, within)

    def where(self) -> str:
        return f"the mix of {', '.join(self.paths)}"

    # -- reading ------------------------------------------------------------------------------
    def _pairs(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, sample index) at mixed ``positions`` of ``epoch``."""
        source, index = self.sequence(epoch)
        return source[positions], index[positions]

    def _read(self, epoch: int, positions: np.ndarray) -> list[Record]:
        """Records at the mixed positions, labels offset; each dataset's share read as a few blocks."""
        source, index = self._pairs(epoch, positions)
        out: list[Record | None] = [None] * len(source)
        for i in np.unique(source).tolist():
            where = np.flatnonzero(source == i)
            shift = self.offsets[i]
            for k, record in zip(where.tolist(), self.readers[i].read_many(index[where])):
                no_class = record.label < 0  # -1, a sample without a class, stays -1
                out[k] = record._replace(label=record.label + shift) if shift and not no_class else record
        return out  # type: ignore[return-value]

    def planned_reads(self, epoch: int, positions: np.ndarray) -> list[tuple[Any, np.ndarray]]:
        source, index = self._pairs(epoch, positions)
        return [(self.readers[i], index[source == i]) for i in np.unique(source).tolist()]

    def source_readers(self) -> list[Any]:
        return list(self.readers)

    def describe(self, position: int) -> str:
        assert self._pass is not None
        source, index = self._pairs(self._pass.epoch, np.array([position]))
        return self.readers[int(source[0])].describe(int(index[0]))

    def field_schemas(self) -> list[dict[str, str]]:
        return [r.manifest.fields for r in self.readers]

    def where_fields(self) -> str:
        return f"mix of {', '.join(map(str, self.paths))}"

    def dataset_names(self) -> list[str]:
        return [f"dataset {i} ({path})" for i, path in enumerate(self.paths)]

    def record_sources(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        return self._pairs(epoch, positions)[0]


# ``mix(paths, *, weights=None, seed=0, ...)``: a weighted, deterministic mix of packed datasets; the
# options are ``readers.spec.ReadSpec``'s (those of ``open_iterable``) plus weights, epoch_size, labels.
mix = MixedIterable
