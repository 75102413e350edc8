"""Assembling whole batches inside a worker: one tensor per batch, one transfer per batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from readers.decode import decode_array
from readers.record import Record


def assemble_batch(records: Sequence[Record], layout: str = "CHW") -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``records`` into one uint8 batch tensor (B, C, H, W) or (B, H, W, C) and int64 labels."""
    arrays = [decode_array(r) for r in records]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(
            f"a batch needs images of one size but got {sorted(shapes)[:3]}...; pack with --crop N "
            "(or --resize-mode exact) so every image has the same size"
        )
    images = torch.from_numpy(np.stack(arrays))
    if layout == "CHW":
        images = images.permute(0, 3, 1, 2).contiguous()
    labels = torch.tensor([r.label for r in records], dtype=torch.int64)
    return images, labels
