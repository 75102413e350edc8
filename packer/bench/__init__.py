"""Benchmarking, in one package: ``pack bench`` (compare datasets) and the benchmark suites.

``suites/`` holds one module per question, registered in ``suites/__init__.py`` (``SUITES``),
listed by ``pack bench suites`` and run by ``pack bench run NAME [ARGS]``. Public modules (the
suites, packer/cli.py, scripts/ and docs use them):

- ``harness``: the measuring tools (memory sampler over a process tree, fresh-process runs, epoch
  and first-batch timer, ``code_env`` for children); import-light, so a peer's interpreter can use it;
- ``model``: settings, targets, one run, the report;
- ``baseline``: the image folder read like torchvision's ImageFolder (Pillow, on the fly);
- ``peers``: the peers' loaders as every suite reads them (webdataset);
- ``contenders``: what ``pack bench`` reads and how (batch, per-sample, baseline, DALI);
- ``run``: ``run_bench``, one fresh process per (dataset, worker count);
- ``cold_epoch``: one uncached epoch in a fresh process (``pack bench --cold``, run with ``-m``);
- ``ffcv_epoch``: FFCV's side of ``pack bench --cold --peer ffcv`` (an epoch of a ``.beton``, its
  writer), run with ``-m`` by FFCV's own Python; the standard library only at import;
- ``pagecache``: evicting a dataset from the page cache, memory caps;
- ``cli``: ``pack bench``;
- ``bench_data``: an ImageNet-like JPEG folder, the input most suites share;
- ``coco_data``: a COCO set with its boxes drawn into the pixels;
- ``planted``: a planted near-duplicate set;
- ``prepare``: packs made once and reused, the peers' naive preprocessing;
- ``s3server``: a local S3 server (moto);
- ``delay_proxy``: a TCP proxy adding a store's round trip.

Internal: ``_cold`` (the ``--cold`` rounds), ``_ffcv_peer`` (FFCV's ``.beton`` of a dataset, its
read command), ``_report`` (terminal and markdown tables), ``_plot``
(the PNG chart).

This file imports nothing, so ``import packer.bench.harness`` pulls in nothing heavy.
"""
