"""The CPU DataLoader path of ``readers.dali``: ``open_iterable`` + ``make_loader`` + normalising.

Used when DALI is not installed (or ``device="dataloader"``). It is not a batch path of its own:
the batches are ``open_iterable``'s with the same ``readers.spec.ReadSpec`` (so the same order,
geometry, resampler, augmentation and pixels, bit for bit), read through ``readers.make_loader``
(exact resume, persistent workers that follow ``set_epoch``); only the ``mean``/``std``
normalisation is added, after the workers (a float batch is four times the bytes to pass between
processes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from readers.datasets.iterable import PackedIterable
from readers.datasets.loader import make_loader
from readers.order.resume import ResumeError
from readers.spec import ReadSpec


def normalise(batch: torch.Tensor, mean: Sequence[float], std: Sequence[float], layout: str) -> torch.Tensor:
    """uint8 batch -> float32 ``(batch - mean) / std`` per channel."""
    shape = (1, -1, 1, 1) if layout == "CHW" else (1, 1, 1, -1)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=batch.device).view(shape)
    std_t = torch.tensor(std, dtype=torch.float32, device=batch.device).view(shape)
    return batch.float().sub_(mean_t).div_(std_t)


class FallbackLoader:
    """``dali_loader``'s interface over ``open_iterable`` + ``make_loader``; see the module docstring."""

    backend = "dataloader"

    def __init__(
        self,
        stream: PackedIterable,
        *,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        num_workers: int,
        pin_memory: bool,
    ):
        self.stream = stream
        self.mean, self.std = mean, std
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._loader: Any = None

    @classmethod
    def open(cls, path: Any, spec: ReadSpec, **options: Any) -> FallbackLoader:
        return cls(PackedIterable(path, spec=spec), **options)

    @property
    def loader(self):
        if self._loader is None:
            workers = self.num_workers
            self._loader = make_loader(
                self.stream,
                num_workers=workers,
                pin_memory=self.pin_memory,
                persistent_workers=workers > 0,
            )
        return self._loader

    @property
    def reader(self):
        """The format reader of this process (``DaliLoader.reader`` too)."""
        return self.stream.reader

    @property
    def classes(self) -> list[str]:
        return self.stream.classes

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def __len__(self) -> int:
        return len(self.stream)

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands, in the state format of every ``dali_loader`` path."""
        return self.stream._state(self.loader.global_point())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)
        if self.stream._resume is not None and self.stream._resume.offset:
            self.stream._resume = None
            raise ResumeError("the DALI loader resumes at batch boundaries; this state is mid-batch")
        self._loader = None  # new workers, which take the resume point with the dataset

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            if self.mean is not None:
                assert self.std is not None  # dali_loader takes mean and std together
                images = normalise(images, self.mean, self.std, self.stream.layout)
            yield images, labels
