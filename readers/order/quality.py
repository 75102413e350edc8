"""How well a reading order mixes classes, next to what an i.i.d. shuffle would give.

Block-wise reading (``readers.order.epoch_order``: blocks of ``block_size`` consecutive records, shuffled in
windows of ``buffer_size``) is what makes reads sequential and fast; on a pack that stores its
classes in runs (an old, class-sorted pack, or ``--order source``) it also gives batches that
hold few classes. ``shuffle_quality`` measures it from the labels and the reading options:

- ``mean_distinct``: distinct classes in a batch, on average (i.i.d.: computed exactly, from
  the hypergeometric chance that a batch misses a class);
- ``mean_largest_class``: samples of the most frequent class in a batch, on average (i.i.d.: a
  seeded simulation of the same number of batches);
- ``lag1_autocorrelation``: how much more often two consecutive samples share a class than
  under i.i.d. (0: as often as i.i.d., 1: always), i.e. (P(same) - P_iid(same)) / (1 - P_iid(same)).

It is cheap enough to run when a stream is built: up to ``max_batches`` batches of one rank are
looked at, taken from the real order when the dataset is small, else from a simulation of the
same order (random windows of random blocks), which has the same statistics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from readers.errors import OptionError
from readers.order.epoch_order import OrderSpec

EXACT_LIMIT = 1 << 18  # samples up to which the real order of the epoch is computed
MAX_BATCHES = 256
WARN_RATIO = 0.9  # below this share of the i.i.d. distinct classes a stream warns
MIX_LIMIT = 1 << 20  # epoch samples up to which a mix's sequence is judged when it is built


@dataclass(frozen=True)
class ShuffleQuality:
    batch_size: int
    batches: int  # batches looked at
    num_classes: int
    mean_distinct: float
    iid_mean_distinct: float
    mean_largest_class: float
    iid_mean_largest_class: float
    lag1_autocorrelation: float

    @property
    def distinct_ratio(self) -> float:
        return self.mean_distinct / self.iid_mean_distinct if self.iid_mean_distinct else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "distinct_ratio": round(self.distinct_ratio, 4)}

    def lines(self) -> list[str]:
        return [
            f"distinct classes per batch of {self.batch_size}: {self.mean_distinct:.1f} "
            f"(i.i.d. {self.iid_mean_distinct:.1f}, {self.distinct_ratio:.0%})",
            f"largest class in a batch: {self.mean_largest_class:.1f} "
            f"(i.i.d. {self.iid_mean_largest_class:.1f})",
            f"lag-1 label autocorrelation: {self.lag1_autocorrelation:.3f} (i.i.d. 0)",
        ]


def shuffle_quality(
    labels: np.ndarray,
    *,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int = 64,
    buffer_size: int = 4096,
    world_size: int = 1,
    drop_last: bool = False,
    max_batches: int = MAX_BATCHES,
) -> ShuffleQuality:
    """The figures above for batches of ``batch_size`` read from a dataset with ``labels`` (one
    per sample, in stored order) with these reading options (rank 0's batches). Label -1 (a
    sample of no single class, in datasets with fields) counts as one class of its own."""
    labels = _non_negative(labels)
    n = len(labels)
    if batch_size < 1:
        raise OptionError(f"batch_size must be a positive integer, got {batch_size}")
    b = min(batch_size, n)
    order = OrderSpec(n, shuffle, seed, block_size, buffer_size, 0, world_size, drop_last, unit=b)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, n, 0x51])
    if n <= EXACT_LIMIT or not shuffle:
        stream = labels[order.epoch_order(epoch)] if n <= EXACT_LIMIT else labels
        batches = _stream_batches(stream, b, max_batches, rng)
    else:
        batches = _simulated_batches(labels, b, block_size, buffer_size, max_batches, rng)
    return _figures(batches, labels, rng)


def stream_quality(stream: np.ndarray, *, batch_size: int, seed: int = 0, max_batches: int = MAX_BATCHES):
    """The figures for batches cut from ``stream``, the labels in the order they are consumed
    (e.g. a ``mix``'s epoch), judged against an i.i.d. draw from the same labels."""
    stream = _non_negative(stream)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, len(stream), 0x52])
    return _figures(_stream_batches(stream, min(batch_size, len(stream)), max_batches, rng), stream, rng)


def _non_negative(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    return labels + 1 if len(labels) and labels.min() < 0 else labels  # -1: "no class" as a class


def _stream_batches(stream: np.ndarray, b: int, max_batches: int, rng: np.random.Generator) -> np.ndarray:
    whole = len(stream) // b
    if not whole:
        return stream[None, :b]
    picks = np.sort(rng.choice(whole, size=min(whole, max_batches), replace=False)).tolist()
    return np.stack([stream[k * b : (k + 1) * b] for k in picks])


def _figures(batches: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> ShuffleQuality:
    n, b = len(labels), batches.shape[1]
    distinct, largest = _batch_counts(batches)
    iid = np.stack([labels[rng.choice(n, size=b, replace=False)] for _ in range(len(batches))])
    _, iid_largest = _batch_counts(iid)
    counts = np.bincount(labels - labels.min()) if n else np.zeros(0, dtype=np.int64)
    return ShuffleQuality(
        batch_size=b,
        batches=len(batches),
        num_classes=int(np.count_nonzero(counts)),
        mean_distinct=float(distinct.mean()),
        iid_mean_distinct=_iid_distinct(counts, n, b),
        mean_largest_class=float(largest.mean()),
        iid_mean_largest_class=float(iid_largest.mean()),
        lag1_autocorrelation=_lag1(batches, counts, n),
    )


def _batch_counts(batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct classes and the largest class count of each row."""
    rows, width = batches.shape
    shift = int(batches.max(initial=0)) + 1
    keys = np.sort((np.arange(rows, dtype=np.int64)[:, None] * shift + batches).ravel())
    unique, counts = np.unique(keys, return_counts=True)
    row_of = unique // shift
    distinct = np.bincount(row_of, minlength=rows)
    largest = np.zeros(rows, dtype=np.int64)
    np.maximum.at(largest, row_of, counts)
    return distinct, largest


def _iid_distinct(counts: np.ndarray, n: int, b: int) -> float:
    """E[distinct classes] in ``b`` samples drawn without replacement from ``n``."""
    total = 0.0
    log_all = math.lgamma(n + 1) - math.lgamma(n - b + 1)
    for count in counts[counts > 0].tolist():
        rest = n - count
        miss = 0.0 if rest < b else math.exp(math.lgamma(rest + 1) - math.lgamma(rest - b + 1) - log_all)
        total += 1.0 - miss
    return total


def _lag1(batches: np.ndarray, counts: np.ndarray, n: int) -> float:
    same = float((batches[:, 1:] == batches[:, :-1]).mean()) if batches.shape[1] > 1 else 0.0
    iid_same = float((counts * (counts - 1)).sum() / (n * (n - 1))) if n > 1 else 1.0
    return (same - iid_same) / (1.0 - iid_same) if iid_same < 1.0 else 0.0


def _simulated_batches(
    labels: np.ndarray, b: int, block: int, buffer: int, max_batches: int, rng: np.random.Generator
) -> np.ndarray:
    """Batches with the statistics of ``readers.order.epoch_order.global_order``: a window of
    ``buffer_size // block_size`` random blocks, shuffled, cut into batches (no buffer: runs of
    random blocks)."""
    n = len(labels)
    block = max(1, int(block))
    num_blocks = math.ceil(n / block)
    per_window = max(1, int(buffer) // block) if buffer > 0 else 0
    if per_window <= 1:
        per_window = math.ceil(b / block) + 1
        shuffle_window = False
    else:
        shuffle_window = True
    per_window = min(per_window, num_blocks)
    out: list[np.ndarray] = []
    while len(out) < max_batches:
        chosen = rng.choice(num_blocks, size=per_window, replace=False)
        window = np.concatenate([labels[k * block : (k + 1) * block] for k in chosen.tolist()])
        if shuffle_window:
            window = rng.permutation(window)
        for k in range(len(window) // b):
            out.append(window[k * b : (k + 1) * b])
            if not shuffle_window or len(out) >= max_batches:
                break
    return np.stack(out)


_warned: set[tuple] = set()


def cheap_labels(reader: Any) -> np.ndarray | None:
    """Every label of ``reader`` when that costs no pass over the data (else None): from the
    format's label file (or an older pack's label runs), or a local reader's own label table."""
    from readers.formats.base import FormatReader

    stored = reader.stored_labels() if isinstance(reader, FormatReader) else None
    if stored is not None:
        return stored
    if not reader.remote and type(reader).labels is not FormatReader.labels:
        return reader.labels()
    return None


def packed_shuffled(reader: Any) -> bool:
    """Whether the pack was written in a shuffled order: its blocks are then random draws, and a
    batch short of classes is chance, not a run of one class (no warning, no cost)."""
    order = reader.manifest.extra.get("order") or {}
    return order.get("kind") == "shuffled"


def warn_if_poorly_mixed(where: str, reader: Any, order: OrderSpec, batch_size: int | None) -> None:
    """One ``UserWarning`` per dataset and options when batches hold under ``WARN_RATIO`` of the
    i.i.d. distinct classes (a class-sorted pack read block-wise), naming the fixes."""
    if not order.shuffle or not batch_size or order.num_samples < 2 * batch_size or packed_shuffled(reader):
        return
    key = (where, order.seed, order.block_size, order.buffer_size, batch_size, order.world_size)
    if key in _warned:
        return
    labels = cheap_labels(reader)
    if labels is None:
        return
    quality = shuffle_quality(
        labels,
        batch_size=batch_size,
        seed=order.seed,
        block_size=order.block_size,
        buffer_size=order.buffer_size,
        world_size=order.world_size,
        drop_last=order.drop_last,
        max_batches=64,
    )
    _warned.add(key)
    _warn_below(where, quality, order.block_size, order.buffer_size)


def warn_if_mix_poorly_mixed(mix: Any) -> None:
    """``warn_if_poorly_mixed`` for a ``readers.datasets.mix`` stream: judged on its epoch 0 sequence
    (skipped past ``MIX_LIMIT`` samples, where building it would slow construction down)."""
    if not mix.batch_size or mix.epoch_size > MIX_LIMIT or mix.epoch_size < 2 * mix.batch_size:
        return
    if all(packed_shuffled(reader) for reader in mix.readers):
        return
    key = (tuple(mix.paths), mix.seed, mix.block_size, mix.buffer_size, mix.batch_size, mix.epoch_size)
    tables = [cheap_labels(reader) for reader in mix.readers]
    if key in _warned or any(table is None for table in tables):
        return
    _warned.add(key)
    source, index = mix.epoch_sequence(0)
    stream = np.empty(len(source), dtype=np.int64)
    for i, table in enumerate(tables):
        mine = source == i
        stream[mine] = table[index[mine]] + mix.offsets[i]  # type: ignore[index]
    quality = stream_quality(stream, batch_size=mix.batch_size, seed=mix.seed, max_batches=64)
    _warn_below(", ".join(mix.paths), quality, mix.block_size, mix.buffer_size)


def _warn_below(where: str, quality: ShuffleQuality, block_size: int, buffer_size: int) -> None:
    if quality.distinct_ratio >= WARN_RATIO:
        return
    import warnings

    warnings.warn(
        f"{where}: batches of {quality.batch_size} hold {quality.mean_distinct:.1f} distinct "
        f"classes on average, {quality.distinct_ratio:.0%} of an i.i.d. shuffle's "
        f"{quality.iid_mean_distinct:.1f} (block_size={block_size}, buffer_size={buffer_size}): "
        "the pack stores its classes in runs. Re-pack with the default `--order shuffled`, or "
        "read with a smaller block_size or a larger buffer_size",
        UserWarning,
        stacklevel=4,
    )
