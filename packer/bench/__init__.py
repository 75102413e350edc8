"""Benchmarking, in one package: ``pack bench`` and every script in scripts/bench_*.py use it.

- ``harness``: the measuring tools (memory sampler over a process tree, fresh-process runs,
  epoch and first-batch timer); import-light, so a peer's interpreter can use it too;
- ``model``: settings, targets, one run, the report;
- ``baseline``: the image folder read like torchvision's ImageFolder (Pillow, on the fly);
- ``contenders``: what ``pack bench`` reads and how (batch, per-sample, baseline, DALI);
- ``run``: ``run_bench``, one fresh process per (dataset, worker count);
- ``report``: terminal and markdown tables; ``plot``: the PNG chart; ``cli``: ``pack bench``.

This file imports nothing, so ``import packer.bench.harness`` pulls in nothing heavy.
"""
