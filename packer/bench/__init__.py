"""Benchmarking, in one package: ``pack bench`` and every script in scripts/bench_*.py use it.

- ``harness``: the measuring tools (memory sampler over a process tree, fresh-process runs,
  epoch and first-batch timer); import-light, so a peer's interpreter can use it too;
- ``model``: settings, targets, one run, the report;
- ``baseline``: the image folder read like torchvision's ImageFolder (Pillow, on the fly);
- ``contenders``: what ``pack bench`` reads and how (batch, per-sample, baseline, DALI);
- ``run``: ``run_bench``, one fresh process per (dataset, worker count);
- ``report``: terminal and markdown tables, the PNG chart; ``cli``: the ``pack bench`` command.

Names are imported on first use, so ``import packer.bench.harness`` pulls in nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BenchError": "packer.bench.harness",
    "MemorySampler": "packer.bench.harness",
    "run_isolated": "packer.bench.harness",
    "run_measured": "packer.bench.harness",
    "time_epochs": "packer.bench.harness",
    "take_turns": "packer.bench.harness",
    "folder_bytes": "packer.bench.harness",
    "BASELINE_NAME": "packer.bench.model",
    "BenchReport": "packer.bench.model",
    "DatasetInfo": "packer.bench.model",
    "Run": "packer.bench.model",
    "Settings": "packer.bench.model",
    "Target": "packer.bench.model",
    "ImageFolderBaseline": "packer.bench.baseline",
    "collate_list": "packer.bench.baseline",
    "measure_isolated": "packer.bench.run",
    "measure_loader": "packer.bench.run",
    "run_bench": "packer.bench.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packer.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
