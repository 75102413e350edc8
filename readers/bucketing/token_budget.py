"""A token budget for variable-resolution ViTs: batches whose patch count fits ``budget``.

``TokenBudget(patch=16, budget=4096, seq_lens=(64, 144, 256))`` as ``buckets=`` reads batches the
way timm's NaFlex loader plans them: each batch has a sequence length L from ``seq_lens`` and
holds ``budget // L`` images, so a batch never has more than ``budget`` patches. Where NaFlex
resizes each image to its own patch grid and pads the batch to L patches with a mask, here every
image of a batch has the *same* grid, so a batch is one plain ``(B, C, H, W)`` tensor (no mask):

- the grids of L are the patch grids (rows, columns) of at most L patches, long side at most
  ``max_ratio`` times the short one, as wide as L allows for each height;
- an image read at L takes the grid of L nearest its stored aspect ratio (as ``AspectBuckets``
  does) and is resized to ``(rows * patch, columns * patch)``, cropped by the least amount;
- a batch is one (L, grid) *cell*: ``budget // L`` images of one grid, ``rows * columns <= L``
  patches each.

Which L an image is read at changes from epoch to epoch but how many images each cell holds does
not, so an epoch always has the same batches (readers/bucketing/token_order.py): images whose nearest grids
agree at every L form a class, and each class sends a fixed share of its images to each L, the
images drawn in the epoch's order. The share follows NaFlex, which picks L uniformly per batch:
a length's share of the images is proportional to its batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from readers.bucketing.buckets import _Buckets, bucket_of
from readers.errors import OptionError
from readers.image.geometry import Pair


@dataclass(frozen=True, kw_only=True)
class TokenBudget(_Buckets):
    """Batches of ``budget // L`` images at one patch grid of at most L patches, L from ``seq_lens``."""

    leftover_rules: ClassVar[tuple[str, ...]] = ("shrink", "pad", "drop")
    leftover: str = "shrink"
    patch: int = 16
    budget: int = 4096
    seq_lens: tuple[int, ...] = (64, 144, 256)
    max_ratio: float = 4.0
    _grids: tuple[tuple[Pair, ...], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_common()
        for name in ("patch", "budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptionError(f"TokenBudget {name}={value!r} must be a positive integer")
        lens = self.seq_lens
        if isinstance(lens, int) or not isinstance(lens, Sequence) or not lens or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lens
        ):
            raise OptionError(f"TokenBudget seq_lens={lens!r} must be a list of positive integers")
        lens = tuple(sorted(set(lens)))
        if lens[-1] > self.budget:
            raise OptionError(
                f"TokenBudget seq_lens has {lens[-1]}, more patches than budget={self.budget}: a batch "
                "holds budget // L images; raise budget or drop that length"
            )
        if not isinstance(self.max_ratio, (int, float)) or self.max_ratio < 1:
            raise OptionError(f"TokenBudget max_ratio={self.max_ratio!r} must be a number >= 1")
        object.__setattr__(self, "seq_lens", lens)
        object.__setattr__(self, "_grids", tuple(patch_grids(n, float(self.max_ratio)) for n in lens))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Images per batch at each sequence length: ``budget // L``."""
        return tuple(self.budget // n for n in self.seq_lens)

    @property
    def slots(self) -> int:
        """Positions a batch takes in the schedule: the largest batch (readers/bucketing/token_order.py)."""
        return max(self.batch_sizes)

    @property
    def grids(self) -> tuple[tuple[Pair, ...], ...]:
        """The patch grids (rows, columns) of each sequence length, tallest first."""
        return self._grids

    @property
    def cells(self) -> tuple[tuple[int, Pair], ...]:
        """Every (sequence length index, grid) a batch can be, in order: a cell's id is its place."""
        return tuple((i, g) for i, grids in enumerate(self._grids) for g in grids)

    def cell_pixels(self, cell: int) -> Pair:
        """The (height, width) in pixels of the images of a batch of ``cell``."""
        rows, columns = self.cells[cell][1]
        return rows * self.patch, columns * self.patch

    @property
    def sizes(self) -> tuple[Pair, ...]:
        return tuple(dict.fromkeys(self.cell_pixels(c) for c in range(len(self.cells))))

    def batch_slots(self, batch_size: int | None) -> int:
        if batch_size is not None and batch_size != self.slots:
            raise OptionError(
                f"batch_size={batch_size} with buckets=TokenBudget(...): the budget sets each batch's "
                f"size (budget // L, up to {self.slots}); drop batch_size="
            )
        return self.slots

    def check_spec(self, spec: Any) -> None:
        """The per-sample path cannot honour a token budget: a DataLoader batches one size."""
        per_sample = ("loader_batch_size", "transform", "target_transform")
        given = [n for n in per_sample if getattr(spec, n) is not None]
        given += ["decode"] if spec.decode != "tensor" else []
        if given:
            raise OptionError(
                "buckets=TokenBudget(...) reads whole batches of budget // L images (their size varies "
                "with L, which a DataLoader batching samples cannot follow): "
                f"drop {', '.join(n + '=' for n in given)} and transform each batch with batch_transform="
            )

    def grid_ids(self, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """(N, len(seq_lens)) int64: each stored size's nearest grid at each sequence length."""
        cols = [bucket_of(grids, heights, widths) for grids in self._grids]
        return np.stack(cols, axis=1) if cols else np.zeros((len(heights), 0), np.int64)

    def key(self, group: int) -> str:
        lens = ",".join(map(str, self.seq_lens))
        return (
            f"tokens:patch={self.patch};budget={self.budget};seq_lens={lens};max_ratio={self.max_ratio};"
            f"leftover={self.leftover};group={group};offset={int(self.random_offset)}"
        )


def patch_grids(seq_len: int, max_ratio: float) -> tuple[Pair, ...]:
    """The grids of at most ``seq_len`` patches, ratio <= ``max_ratio``, none inside another
    (a grid fitting inside a larger one would only waste patches), from the tallest to the widest."""
    widest = []  # for each height, the widest grid allowed
    for rows in range(1, seq_len + 1):
        columns = min(seq_len // rows, int(rows * max_ratio + 1e-9))
        if columns >= 1 and rows <= columns * max_ratio + 1e-9:
            widest.append((rows, columns))
    grids = [g for g in widest if not any(o != g and o[0] >= g[0] and o[1] >= g[1] for o in widest)]
    return tuple(sorted(grids, key=lambda g: (-g[0] / g[1], g)))


@dataclass(frozen=True)
class TokenPlan:
    """What the schedule needs of a dataset: each sample's cell at each length, the classes of
    samples that share their grids, and the fixed share of each class read at each length."""

    cell_ids: np.ndarray  # (N, lengths): the cell of each sample at each length
    classes: np.ndarray  # (N,): samples with the same grids at every length share a class
    quotas: np.ndarray  # (classes, lengths): samples of a class read at each length, every epoch
    counts: np.ndarray  # (cells,): samples of each cell, every epoch
    cell_batch: np.ndarray  # (cells,): images per batch of each cell

    def epoch_cells(self, base: np.ndarray) -> np.ndarray:
        """Each sample's cell in an epoch whose order is ``base``: a class's samples, in that
        order, go to the first length until its quota is met, then to the next..."""
        n = len(base)
        cells = np.zeros(n, dtype=np.int64)
        if not n:
            return cells
        of_base = self.classes[base]
        grouped = np.argsort(of_base, kind="stable")
        members = base[grouped]
        klass = of_base[grouped]
        starts = np.searchsorted(klass, klass, side="left")
        rank_in_class = np.arange(n) - starts
        bounds = np.cumsum(self.quotas, axis=1)[klass]
        length = (bounds <= rank_in_class[:, None]).sum(axis=1)
        cells[members] = self.cell_ids[members, length]
        return cells


def token_plan(budget: TokenBudget, sizes: np.ndarray) -> TokenPlan:
    """The plan of ``budget`` for samples stored at ``sizes`` ((N, 2) height, width)."""
    # the grids depend on the stored size alone: work them out once per distinct size
    size_keys = sizes[:, 0].astype(np.int64) * (int(sizes[:, 1].max(initial=0)) + 1) + sizes[:, 1]
    distinct, of_sample = np.unique(size_keys, return_index=True, return_inverse=True)[1:]
    distinct_grids = budget.grid_ids(sizes[distinct, 0], sizes[distinct, 1])
    radix = np.cumprod([1, *(len(g) for g in budget.grids)])[:-1].astype(np.int64)
    _, class_of_size = np.unique(distinct_grids @ radix, return_inverse=True)
    classes = class_of_size.reshape(-1)[of_sample.reshape(-1)].astype(np.int64)
    offsets = np.cumsum([0, *(len(g) for g in budget.grids)])[:-1].astype(np.int64)
    cell_ids = distinct_grids[of_sample.reshape(-1)] + offsets[None, :]
    members = np.bincount(classes, minlength=int(classes.max(initial=-1)) + 1)
    quotas = shares(members, np.asarray(budget.batch_sizes, dtype=np.float64))
    num_cells = len(budget.cells)
    counts = np.zeros(num_cells, dtype=np.int64)
    first = np.zeros(len(members), dtype=np.int64)
    first[classes[::-1]] = np.arange(len(classes))[::-1]  # a sample of each class: its cells
    for c in range(len(members)):
        np.add.at(counts, cell_ids[first[c]], quotas[c])
    cell_batch = np.asarray([budget.batch_sizes[i] for i, _ in budget.cells], dtype=np.int64)
    # int32: the plan travels to every DataLoader worker (N x lengths entries)
    return TokenPlan(cell_ids.astype(np.int32), classes.astype(np.int32), quotas, counts, cell_batch)


def shares(members: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(classes, lengths) int64: ``members`` of each class split in proportion to ``weights``,
    rounded by the largest remainder (ties to the shorter length), each row summing to its class."""
    exact = members[:, None] * weights[None, :] / weights.sum()
    out = np.floor(exact).astype(np.int64)
    short = members - out.sum(axis=1)
    by_remainder = np.argsort(-(exact - out), axis=1, kind="stable")
    for c in np.flatnonzero(short).tolist():
        out[c, by_remainder[c, : short[c]]] += 1
    return out
