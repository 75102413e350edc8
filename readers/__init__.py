"""imgpack readers: the public API for training jobs.

    from readers import open_dataset, open_iterable, seed_everything, seed_worker, make_generator

Attributes are imported on first use, so ``import readers`` stays light (the packer imports
``readers.store.manifest`` without pulling in torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "open_dataset": "readers.datasets.dataset",
    "PackedDataset": "readers.datasets.dataset",
    "DeterministicSampler": "readers.datasets.dataset",
    "open_iterable": "readers.datasets.iterable",
    "RandomResizedCrop": "readers.image.geometry",
    "AspectBuckets": "readers.bucketing.buckets",
    "BucketList": "readers.bucketing.buckets",
    "TokenBudget": "readers.bucketing.token_budget",
    "PackedIterable": "readers.datasets.iterable",
    "ReadSpec": "readers.spec",
    "OptionError": "readers.errors",
    "seed_everything": "readers.order.seeding",
    "seed_worker": "readers.order.seeding",
    "make_generator": "readers.order.seeding",
    "CudaPrefetcher": "readers.batch.prefetch",
    "read_manifest": "readers.store.manifest",
    "Manifest": "readers.store.manifest",
    "ImgpackError": "readers.errors",
    "ManifestError": "readers.errors",
    "ChecksumError": "readers.errors",
    "DatasetReplacedError": "readers.errors",
    "open_reader": "readers.formats",
    "dali_loader": "readers.dali",
    "make_loader": "readers.datasets.loader",
    "PackedLoader": "readers.datasets.loader",
    "ResumeError": "readers.order.resume",
    "mix": "readers.datasets.mix",
    "MixedIterable": "readers.datasets.mix",
    "source_paths": "readers.store.sample_sources",
    "source_index": "readers.store.sample_sources",
    "shuffle_quality": "readers.order.quality",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'readers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
