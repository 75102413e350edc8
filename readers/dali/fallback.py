"""The CPU DataLoader path of ``readers.dali``: the same batches and geometry, done in torch.

Used when DALI is not installed (or ``device="dataloader"``). Workers read the batches that
``BatchFeed`` plans, decode with the readers' CPU decoders, resize (bilinear with antialiasing,
like DALI's default), crop the same windows as DALI (``BatchFeed.plan``), flip, and normalise; the DataLoader
collects batches from its workers round-robin, so they arrive in the planned order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from readers.dali.feed import BatchFeed, Plan
from readers.decode import decode_array
from readers.jpegwindow import decode_windows
from readers.order import worker_chunks


def resize_image(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """CHW uint8 -> CHW uint8 of ``size`` (bilinear, antialiased when shrinking, rounded)."""
    if tuple(image.shape[1:]) == size:
        return image
    out = F.interpolate(image[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].round_().clamp_(0, 255).to(torch.uint8)


def transform_batch(arrays: Sequence[np.ndarray], plan: Plan, feed: BatchFeed, layout: str) -> torch.Tensor:
    """Decoded HWC arrays -> one uint8 (B, C, H, W) or (B, H, W, C) tensor, resized, cropped, flipped."""
    out = []
    for i, array in enumerate(arrays):
        if not array.flags.writeable:
            array = array.copy()  # raw records are read-only views; torch wants writable memory
        image = torch.from_numpy(array).permute(2, 0, 1)
        if plan.sizes is not None:
            image = resize_image(image, tuple(plan.sizes[i].astype(int).tolist()))
        if plan.windows is not None:
            top, left, h, w = plan.windows[i].tolist()
            image = image[:, top : top + h, left : left + w]
        if feed.random_crop is not None:
            image = resize_image(image, feed.random_crop.out)
        if plan.flips is not None and plan.flips[i]:
            image = image.flip(-1)
        out.append(image)
    batch = torch.stack(out)
    if layout == "HWC":
        batch = batch.permute(0, 2, 3, 1)
    return batch.contiguous()


def normalise(batch: torch.Tensor, mean: Sequence[float], std: Sequence[float], layout: str) -> torch.Tensor:
    """uint8 batch -> float32 ``(batch - mean) / std`` per channel (done after the workers: a
    float batch is four times the bytes to pass between processes)."""
    shape = (1, -1, 1, 1) if layout == "CHW" else (1, 1, 1, -1)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=batch.device).view(shape)
    std_t = torch.tensor(std, dtype=torch.float32, device=batch.device).view(shape)
    return batch.float().sub_(mean_t).div_(std_t)


class FallbackBatches(IterableDataset):
    """One epoch of ``feed``'s uint8 batches as an IterableDataset (run with ``batch_size=None``)."""

    def __init__(self, feed: BatchFeed, layout: str):
        self.feed = feed
        self.layout = layout
        # Shared with the worker processes, so persistent workers see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        bs, epoch = self.feed.batch_size, int(self._epoch.item())
        for start, _ in worker_chunks(self.feed.batches_in(epoch) * bs, bs, worker, workers, drop_last=False):
            records, plan = self.feed.batch(epoch, start // bs)
            if plan.windows is not None and plan.sizes is None:  # crops of the stored pixels
                arrays, windows = decode_windows(records, plan.windows)  # JPEGs: only the window
                plan = plan._replace(windows=windows)
            else:
                arrays = [decode_array(r) for r in records]
            images = transform_batch(arrays, plan, self.feed, self.layout)
            yield images, torch.tensor([r.label for r in records], dtype=torch.int64)


def fallback_loader(dataset: FallbackBatches, num_workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=2 if num_workers else None,
        persistent_workers=num_workers > 0,
    )
