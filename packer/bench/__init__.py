"""Benchmarking, in one package: ``pack bench`` (compare datasets) and the benchmark suites.

- ``suites/``: one module per question, registered in ``suites/__init__.py`` (``SUITES``), listed
  by ``pack bench suites`` and run by ``pack bench run NAME [ARGS]``;
- ``harness``: the measuring tools (memory sampler over a process tree, fresh-process runs,
  epoch and first-batch timer, ``code_env`` for children); import-light, so a peer's
  interpreter can use it too;
- ``model``: settings, targets, one run, the report;
- ``baseline``: the image folder read like torchvision's ImageFolder (Pillow, on the fly);
- ``contenders``: what ``pack bench`` reads and how (batch, per-sample, baseline, DALI);
- ``run``: ``run_bench``, one fresh process per (dataset, worker count); ``cold``,
  ``cold_epoch``, ``pagecache``: uncached epochs (``pack bench --cold``);
- ``report``: terminal and markdown tables; ``plot``: the PNG chart; ``cli``: ``pack bench``;
- the inputs the suites share: ``bench_data`` (an ImageNet-like JPEG folder), ``coco_data`` (a
  COCO set with its boxes drawn into the pixels), ``planted`` (near-duplicates), ``prepare``
  (packs made once); the peers' surroundings: ``s3server`` (a local S3 server),
  ``delay_proxy`` (a store's round trip).

This file imports nothing, so ``import packer.bench.harness`` pulls in nothing heavy.
"""
