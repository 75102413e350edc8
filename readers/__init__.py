"""imgpack readers: the public API for training jobs.

    from readers import open_dataset, open_iterable, seed_everything, seed_worker, make_generator

Attributes are imported on first use, so ``import readers`` stays light (the packer imports
``readers.manifest`` without pulling in torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "open_dataset": "readers.dataset",
    "PackedDataset": "readers.dataset",
    "DeterministicSampler": "readers.dataset",
    "open_iterable": "readers.iterable",
    "RandomResizedCrop": "readers.geometry",
    "AspectBuckets": "readers.buckets",
    "BucketList": "readers.buckets",
    "TokenBudget": "readers.token_budget",
    "PackedIterable": "readers.iterable",
    "ReadSpec": "readers.spec",
    "OptionError": "readers.errors",
    "seed_everything": "readers.seeding",
    "seed_worker": "readers.seeding",
    "make_generator": "readers.seeding",
    "CudaPrefetcher": "readers.prefetch",
    "read_manifest": "readers.manifest",
    "Manifest": "readers.manifest",
    "ImgpackError": "readers.errors",
    "ManifestError": "readers.errors",
    "ChecksumError": "readers.errors",
    "DatasetReplacedError": "readers.errors",
    "open_reader": "readers.formats",
    "dali_loader": "readers.dali",
    "make_loader": "readers.loader",
    "PackedLoader": "readers.loader",
    "ResumeError": "readers.resume",
    "mix": "readers.mix",
    "MixedIterable": "readers.mix",
    "source_paths": "readers.sample_sources",
    "source_index": "readers.sample_sources",
    "shuffle_quality": "readers.quality",
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
