"""The batch assembler of a token-budget read: each image's cover window resized to its cell's grid.

``TokenAssembler`` is the bucketed assembler (readers/bucket_batch.py) whose output size is the
batch's cell (sequence length, grid; readers/token_budget.py) rather than a function of the
stored size alone: an image's grid depends on the length the epoch reads it at. The cell of each
sample in an epoch comes from the order (``TokenOrder.cells``), so any worker, rank or resumed
pass sizes a batch the same way; every image of a batch shares its cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from readers.batch import Geometry, Params
from readers.bucket_batch import BucketAssembler
from readers.errors import ImgpackError
from readers.record import Record
from readers.token_budget import TokenBudget
from readers.token_order import TokenOrder


class TokenAssembler(BucketAssembler):
    def __init__(self, budget: TokenBudget, order: TokenOrder, layout: str = "CHW", decode_threads: int = 0,
                 fast_dct: bool = False, dct_scaling: bool = True, flip: float = 0.0,
                 seed: int = 0):  # fmt: skip
        super().__init__(budget, layout, decode_threads, fast_dct, dct_scaling, flip, seed)
        self.budget = budget
        self.order = order
        self._epoch_cells: tuple[int, np.ndarray] | None = None
        self._out: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_epoch_cells"] = None  # a worker works out its epochs' cells itself
        return state

    def cell_of(self, indices: Sequence[int] | np.ndarray, epoch: int) -> int:
        """The one cell the samples at ``indices`` are read at in ``epoch``."""
        if self._epoch_cells is None or self._epoch_cells[0] != epoch:
            self._epoch_cells = (epoch, self.order.cells(epoch))
        cells = np.unique(self._epoch_cells[1][np.asarray(indices, dtype=np.int64)])
        if len(cells) != 1:
            raise ImgpackError(f"a token-budget batch spans cells {cells.tolist()}: its schedule is broken")
        return int(cells[0])

    def _select(self, indices: Sequence[int] | np.ndarray | None, epoch: int) -> None:
        if indices is None:
            raise ValueError("a token-budget batch needs the global sample index of every record")
        self._out = self.budget.cell_pixels(self.cell_of(indices, epoch))

    def geometry(self, height: int, width: int) -> Geometry:
        """The batch's cell size for every image (set by ``params``, which each batch starts with)."""
        assert self._out is not None, "params() sets the batch's cell first"
        return Geometry((height, width), 0, 0, self._out)

    def params(
        self, records: Sequence[Record], indices: Sequence[int] | np.ndarray | None, epoch: int
    ) -> list[Params]:
        if records:
            self._select(indices, epoch)
        return super().params(records, indices, epoch)

    def __call__(self, records: Sequence[Record], out: np.ndarray | None = None,
                 indices: Sequence[int] | np.ndarray | None = None, epoch: int = 0,
                 params: Sequence[Params] | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        self._select(indices, epoch)
        return super().__call__(records, out, indices, epoch, params)

    def shared(self, records: Sequence[Record], indices: Sequence[int] | np.ndarray | None = None,
               epoch: int = 0, fields: dict[str, Any] | None = None,
               params: Sequence[Params] | None = None) -> Any:  # fmt: skip
        self._select(indices, epoch)
        return super().shared(records, indices, epoch, fields, params)


def bucket_assembler(spec: Any, order: Any) -> BucketAssembler:
    """The assembler of a bucketed read (``spec.buckets`` set; ``order``: its schedule)."""
    options = (spec.layout, spec.decode_threads, spec.fast_dct, spec.dct_scaling, float(spec.flip), spec.seed)
    if isinstance(spec.buckets, TokenBudget):
        return TokenAssembler(spec.buckets, order, *options)
    return BucketAssembler(spec.buckets, *options)
