"""The benchmark suites: one module each, registered here, run by ``pack bench run NAME [ARGS]``.

A suite is a module with a ``main()`` that reads its options from ``sys.argv`` (argparse) and
measures one question on this machine, on the shared tools of ``packer.bench`` (the harness, the
contenders, the data makers). ``pack bench suites`` lists this registry; ``pack bench run NAME
--help`` gives a suite's options. A new suite is one module in this folder plus one line below.
The data makers the suites share (``kind="data"``) are registered too, so every runnable piece of
the package is reached the same way.

This file imports nothing heavy: listing the suites imports none of them.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType

from readers.errors import OptionError


@dataclass(frozen=True)
class Suite:
    """One runnable benchmark (``kind="suite"``) or data maker (``kind="data"``)."""

    name: str
    description: str  # one line, for ``pack bench suites`` and docs/benchmarks.md
    module: str
    kind: str = "suite"
    needs: str = ""  # what must be installed or present beyond imgpack[dev], if anything

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


def _suite(name: str, description: str, needs: str = "") -> Suite:
    return Suite(name, description, f"packer.bench.suites.{name}", needs=needs)


SUITES: tuple[Suite, ...] = (
    # reading
    _suite("fastpath", "the batch and per-sample paths against webdataset and FFCV", "FFCV (optional)"),
    _suite("read_paths", "the read paths against the pure decode limit (the same JPEGs in a process pool)"),
    _suite("first_batch", "time from open_iterable to the first batch of a training read, per checkout"),
    _suite("raw_batch", "where a raw-pixel batch's time goes, step by step, in a DataLoader"),
    _suite("jpegwindow", "decoding only the crop window against the whole JPEG, per window scale"),
    _suite("order", "block_size / buffer_size against throughput and class mix, local and remote"),
    _suite("fields", "a read with a caption and 0-20 boxes per sample against the same read without"),
    _suite("buckets", "bucketed reads against the square centre crop: img/s, pixels kept, leftovers"),
    _suite("token_leftovers", "token-budget reads: samples repeated or left out per epoch by leftover rule"),
    _suite("views", "views against their parent: read rate, parent reads per batch, cost to make"),
    _suite("many_ranks", "a real gloo group of many ranks reading one epoch, resumed on another world"),
    # formats and peers
    _suite("tar", "packing and reading tar shards against webdataset's ShardWriter and WebDataset"),
    _suite("tfrecord", "TFRecord shards against tar shards and the tfrecord package's reader"),
    # DALI
    _suite("dali", "images/s of each dali_loader path: DALI GPU, DALI CPU, DataLoader", "DALI (+ a GPU)"),
    _suite("dali_fields", "a dali_loader read with a caption and 0-20 boxes against one without", "DALI"),
    # packing
    _suite("pack", "pack imagefolder against a one-process Pillow + LMDB script"),
    _suite("pack_coco", "pack coco against pack imagefolder on the same images: the cost of boxes"),
    _suite("append", "appending a few % to a pack against a full pack, and the appended read rate"),
    _suite("dedup", "per-sample hashes: near-duplicate recall, pack overlap at scale, hashing cost"),
    # object storage
    _suite("object_storage", "streaming from S3 (local server, delay) vs webdataset, LitData, Streaming"),
    _suite("remote", "remote reads against local ones, and pack verify's workers"),
    _suite("remote_pack", "packing local -> local, s3:// -> s3://, and s3:// -> s3:// on Ray"),
    # scale
    _suite("scaling", "how packing and reading time, disk and memory grow with the number of images"),
    _suite("scan_memory", "a pack's bookkeeping memory against the number of source files"),
    _suite("reader_index_memory", "a reader's per-process index memory against the number of samples"),
    # data makers
    Suite("bench_data", "a deterministic ImageNet-like JPEG folder", "packer.bench.bench_data", "data"),
    Suite("coco_data", "a COCO detection set, boxes drawn into the pixels", "packer.bench.coco_data", "data"),
)  # fmt: skip


def suite_names() -> list[str]:
    return [s.name for s in SUITES]


def suite_named(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    raise OptionError(
        f"no benchmark suite {name!r}: choose one of {', '.join(suite_names())} (pack bench suites)"
    )


def run_suite(name: str, args: list[str]) -> int:
    """Run suite ``name``'s ``main`` with ``args`` as its command line; its exit status."""
    suite = suite_named(name)
    saved = sys.argv
    sys.argv = [f"pack bench run {name}", *args]  # argparse's usage line names the real command
    try:
        status = suite.load().main()
    finally:
        sys.argv = saved
    return status if isinstance(status, int) else 0
