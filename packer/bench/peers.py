"""The peers as the benchmarks read them, one definition each, so every suite measures the same
thing under the same name.

``webdataset_loader``: webdataset as its docs stream shards (local paths or URLs): shard shuffle,
a sample shuffle buffer, simplejpeg decode and a centre crop, whole batches made in the workers
(``batch_size=None`` on the DataLoader)."""

from __future__ import annotations

from typing import Any


def webdataset_loader(urls: list[str], workers: int, batch: int, crop: int, buffer: int = 1000) -> Any:
    import numpy as np
    import simplejpeg
    import torch
    import webdataset as wds

    def sample(s: dict[str, Any]) -> tuple[np.ndarray, int]:
        image = simplejpeg.decode_jpeg(s["jpg"])
        h, w = image.shape[:2]
        top, left = (h - crop) // 2, (w - crop) // 2
        return image[top : top + crop, left : left + crop], int(s["cls"])

    def to_torch(images_labels: Any) -> Any:
        images, labels = images_labels
        return torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels)

    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False, nodesplitter=None)
        .shuffle(buffer)
        .map(sample)
        .batched(batch, partial=True)
        .map(to_torch)
    )
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
