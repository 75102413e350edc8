"""The batch assembler of a token-budget read: each image's cover window resized to its cell's grid.

``TokenAssembler`` is ``readers.batch.batch_assembler.BatchAssembler`` over the read's ``TokenGeometry``
(readers/bucketing/bucket_geometry.py) whose output size is the batch's cell (sequence length, grid;
readers/bucketing/token_budget.py) rather than a function of the stored size alone: an image's grid depends
on the length the epoch reads it at. The cell of each sample in an epoch comes from the order
(``TokenOrder.cells``), so any worker, rank or resumed pass sizes a batch the same way; every
image of a batch shares its cell, and the batch is assembled with that cell's geometry
(``TokenGeometry.at_cell``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from readers.batch.batch_assembler import BatchAssembler
from readers.bucketing.bucket_geometry import TokenGeometry
from readers.bucketing.token_order import TokenOrder
from readers.errors import ImgpackError
from readers.image.geometry import Geometry, Params
from readers.order.epoch_order import OrderSpec
from readers.store.record import Record


class TokenAssembler(BatchAssembler):
    def __init__(self, geometry: TokenGeometry, order: TokenOrder, layout: str = "CHW",
                 decode_threads: int = 0, fast_dct: bool = False, dct_scaling: bool = True):  # fmt: skip
        super().__init__(layout, decode_threads=decode_threads, fast_dct=fast_dct, dct_scaling=dct_scaling,
                         geometry=geometry)  # fmt: skip
        self.token_geometry = geometry  # the read's; read_geometry is the current batch's cell's
        self.order = order
        self._epoch_cells: tuple[int, np.ndarray] | None = None

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
        self.read_geometry = self.token_geometry.at_cell(self.cell_of(indices, epoch))

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


def assembler_of(spec: Any, order: OrderSpec, geometry: Geometry) -> BatchAssembler:
    """The batch assembler of a read over its one ``geometry`` (``spec.geometry``; ``order``: its
    schedule, which picks a token-budget batch's cell)."""
    options = dict(decode_threads=spec.decode_threads, fast_dct=spec.fast_dct, dct_scaling=spec.dct_scaling)
    if isinstance(geometry, TokenGeometry):
        assert isinstance(order, TokenOrder)
        return TokenAssembler(geometry, order, spec.layout, **options)
    return BatchAssembler(spec.layout, geometry=geometry, **options)
