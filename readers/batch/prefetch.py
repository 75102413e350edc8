"""Overlap the host-to-device copy of the next batch with compute on the current one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch


def _to_device(value: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device, non_blocking) for v in value)
    return value


class CudaPrefetcher:
    """Wraps a loader; yields batches already on ``device``, copied on a side CUDA stream.

    Images (the first element of each batch) can be converted on the device to float,
    normalised with ``mean``/``std`` (in 0-255 units; either one alone is fine, and either gives
    float32 unless ``dtype`` says otherwise) and put in channels_last memory format. Without CUDA
    the batches stay on the CPU and get the same conversions; without ``mean``, ``std``, ``dtype``
    and ``channels_last`` they pass through unchanged. The loader's tensors are never modified.
    """

    def __init__(
        self,
        loader: Iterable,
        device: str | torch.device | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        dtype: torch.dtype | None = None,
    ):
        self.loader = loader
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.cuda = self.device.type == "cuda"
        normalising = mean is not None or std is not None
        self.dtype = dtype or (torch.float32 if normalising else None)
        self.mean = None if mean is None else torch.tensor(mean, device=self.device).view(1, -1, 1, 1)
        self.std = None if std is None else torch.tensor(std, device=self.device).view(1, -1, 1, 1)
        self.channels_last = channels_last
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _prepare(self, batch: Any) -> Any:
        if not isinstance(batch, (list, tuple)) or not batch or not isinstance(batch[0], torch.Tensor):
            return batch
        images = batch[0]
        if self.dtype is not None:
            images = images.to(self.dtype)
        # Out of place: on the CPU path ``images`` may still be the loader's own tensor.
        if self.mean is not None:
            images = images - self.mean
        if self.std is not None:
            images = images / self.std
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return type(batch)([images, *batch[1:]])

    def __iter__(self) -> Iterator[Any]:
        if not self.cuda:
            for batch in self.loader:
                yield self._prepare(batch)
            return
        loader = iter(self.loader)
        next_batch = self._preload(loader)
        while next_batch is not None:
            assert self.stream is not None  # made whenever self.cuda
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            batch = next_batch
            for t in batch if isinstance(batch, (list, tuple)) else [batch]:
                if isinstance(t, torch.Tensor):
                    t.record_stream(torch.cuda.current_stream(self.device))
            next_batch = self._preload(loader)
            yield batch

    def _preload(self, loader: Iterator) -> Any:
        try:
            batch = next(loader)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            batch = _to_device(batch, self.device, non_blocking=True)
            return self._prepare(batch)
