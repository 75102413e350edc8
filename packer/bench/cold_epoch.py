"""One measured epoch in a fresh process, for ``pack bench --cold`` (``packer.bench._cold``).

``python -m packer.bench.cold_epoch '<json settings>'`` opens the dataset, reads one epoch through
``make_loader`` and prints ``{"images", "bytes", "seconds", "hinted_bytes", "first_batch_s",
"first_batch_images"}`` as JSON (``packer.bench.ffcv_epoch`` prints the same for FFCV): the
clock starts once the libraries are imported, and the first batch's time and size let the rate
leave out the start of the process (workers, FFCV's compilation). A fresh
process per epoch: pages a live process has mapped (LMDB's map) are not dropped from the cache.

``peer="webdataset"``: the dataset's tar shards read by webdataset (``packer.bench.peers``) instead.
``records_only``: the records are read (by the same stream, order and read-ahead) but not
decoded, which isolates the I/O; else whole batches are decoded and centre-cropped to ``crop``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packer.bench.peers import webdataset_loader
from readers import make_loader, open_iterable
from readers.datasets.iterable import PackedIterable
from readers.store.record import Record


class RecordsOnly(PackedIterable):
    """``open_iterable`` whose batches are (records, bytes) counts: read, never decoded."""

    def _emit_records(
        self, records: list[Record], chunks: list[tuple[np.ndarray, int]], epoch: int
    ) -> Iterator[Any]:
        assert self._pass is not None
        cursor = 0
        for indices, counted in chunks:
            part = records[cursor : cursor + len(indices)]
            cursor += len(indices)
            self._pass.samples += counted
            yield torch.tensor([counted, sum(len(r.data) for r in part), self.hints.hinted_bytes])


def measure(settings: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    options = {
        "batch_size": settings["batch_size"],
        "seed": settings.get("seed", 0),
        "readahead": settings.get("readahead"),
        "crop": settings.get("crop", 224),  # a batch holds one size (records only: not applied)
    }
    loader: Any
    if settings.get("peer") == "webdataset":  # the same tar shards, read by webdataset itself
        shards = sorted(str(p) for p in Path(settings["path"]).glob("*.tar"))
        loader = webdataset_loader(shards, settings.get("workers", 2), options["batch_size"], options["crop"])
    elif settings.get("peer"):
        raise SystemExit(f"cold_epoch: unknown peer {settings['peer']!r} (webdataset)")
    else:
        stream: PackedIterable
        if settings.get("records_only"):
            stream = RecordsOnly(settings["path"], **options)
        else:
            stream = open_iterable(settings["path"], **options)
        stream.set_epoch(settings.get("epoch", 0))
        loader = make_loader(stream, num_workers=settings.get("workers", 2))
    images = nbytes = 0
    hinted: dict[int, int] = {}
    first: tuple[float, int] | None = None  # (seconds, images) when the first batch was in hand
    for k, batch in enumerate(loader):
        if settings.get("records_only"):
            count, size, hints = batch.tolist()
            images += count
            nbytes += size
            hinted[k % max(1, settings.get("workers", 2))] = hints  # each worker's running total
        else:
            images += len(batch[1])
        if first is None:
            first = (time.perf_counter() - start, images)
    seconds = time.perf_counter() - start
    hinted_bytes = sum(hinted.values())
    first_s, first_images = first or (seconds, images)
    return {"images": images, "bytes": nbytes, "seconds": seconds, "hinted_bytes": hinted_bytes,
            "first_batch_s": first_s, "first_batch_images": first_images}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
