#!/usr/bin/env python3
"""Where the time of a raw-pixel batch goes: the W_raw batch path split by cause, per batch.

A W_raw pack (stored uint8 224x224x3 records; ``packer/bench/suites/fastpath.py`` writes one as
``<out>/W_raw.lmdb``) read with ``open_iterable(batch_size=64, shuffle=True)``. On one core, in
this process, each step of a worker's batch is timed alone over the same shuffled batches
(median over ``--rounds``):

- ``copy floor``: the memcpy of the batch's record bytes into a reused buffer, nothing else;
- ``lookup``: ``reader.read_many`` (the LMDB ``getmulti`` and the record headers);
- ``assembly``: ``BatchAssembler.fill`` into a reused buffer, minus the copy floor;
- ``hand-over``: building the ``Lease`` and pickling/unpickling it (what travels to the main process).

Then the real thing: a DataLoader with ``--workers`` workers, once per ``prefetch_factor`` in
``--prefetch`` (rounds alternate the order), with each worker's time per batch split into
working (inside the iterable: the steps above plus the emission loop's own bookkeeping, and
whatever the other worker's copies take from the memory bus) and waiting (in the DataLoader:
for the next request, for the queue to take the batch).

    pack bench run raw_batch --pack /tmp/imgpack-bench/fastpath/W_raw.lmdb --rounds 5
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from readers import open_iterable
from readers.batch.shmring import WorkerRing
from readers.datasets.loader import WHOLE_BATCH_PREFETCH
from readers.formats import open_reader

BATCH = 64


def per_batch_ms(step, batches: list[Any], rounds: int) -> float:
    """Median over rounds of the mean time of ``step(batch)`` over ``batches``, in ms."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        times.append((time.perf_counter() - start) * 1e3 / len(batches))
    return statistics.median(times)


def in_process(pack: str, rounds: int) -> dict[str, float]:
    it = open_iterable(pack, batch_size=BATCH, shuffle=True, seed=0)
    reader = open_reader(pack)
    order = np.random.default_rng(0).permutation(len(reader))
    index_batches = [order[i : i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]
    record_batches = [reader.read_many(b) for b in index_batches]
    assembler = it.assembler
    shape = (BATCH, *assembler.output_shape(record_batches[0]))
    ring = WorkerRing()
    slot = ring.acquire(int(np.prod(shape)))
    assert slot is not None
    hwc = ring.slots[slot][: int(np.prod(shape))].view(shape)
    out = hwc.numpy()
    flat = out.reshape(-1).data.cast("B")

    def copy(records):
        size = len(records[0].data)
        for i, r in enumerate(records):
            flat[i * size : (i + 1) * size] = r.data

    labels = np.zeros(BATCH, dtype=np.int64)

    def hand_over(_):
        # as a DataLoader worker's queue does: torch's ForkingPickler, whose tensor reductions share memory
        ForkingPickler.loads(ForkingPickler.dumps(ring.lease(slot, assembler.present(hwc), labels)))

    hand_over(None)  # the first lease carries the slot's storage; the timed ones only metadata

    figures = {
        "copy floor": per_batch_ms(copy, record_batches, rounds),
        "lookup": per_batch_ms(reader.read_many, index_batches, rounds),
        "fill": per_batch_ms(lambda records: assembler.fill(records, out), record_batches, rounds),
        "hand-over": per_batch_ms(hand_over, record_batches[:1] * 50, rounds),
    }
    figures["assembly"] = figures.pop("fill") - figures["copy floor"]
    return figures


class TimedInWorker(IterableDataset):
    """Wraps a dataset; each worker writes, per pass, its ms per batch inside and outside it."""

    def __init__(self, inner, folder: str):
        self.inner, self.folder = inner, folder

    def __iter__(self):
        inside = outside = 0.0
        count = 0
        items = iter(self.inner)
        handed = None
        while True:
            start = time.perf_counter()
            if handed is not None:
                outside += start - handed
            try:
                item = next(items)
            except StopIteration:
                break
            inside += time.perf_counter() - start
            count += 1
            handed = time.perf_counter()
            yield item
        if count:
            with open(os.path.join(self.folder, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(
                    json.dumps({"working": inside * 1e3 / count, "waiting": outside * 1e3 / count}) + "\n"
                )


def with_workers(pack: str, workers: int, prefetch: list[int], rounds: int, epochs: int) -> dict[int, dict]:
    results: dict[int, dict[str, list[float]]] = {
        p: {"img/s": [], "working": [], "waiting": []} for p in prefetch
    }
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            for p in prefetch if r % 2 == 0 else prefetch[::-1]:
                for stale in glob.glob(os.path.join(folder, "*.jsonl")):
                    os.remove(stale)
                it = open_iterable(pack, batch_size=BATCH, shuffle=True, seed=0)
                loader = DataLoader(
                    TimedInWorker(it, folder),
                    batch_size=None,
                    num_workers=workers,
                    persistent_workers=True,
                    prefetch_factor=p,
                )
                rates = []
                for _ in range(epochs):
                    start = time.perf_counter()
                    count = sum(len(labels) for _, labels in loader)
                    rates.append(count / (time.perf_counter() - start))
                del loader  # workers exit and flush their last lines
                time.sleep(0.2)
                rows = [
                    json.loads(line) for f in glob.glob(os.path.join(folder, "*.jsonl")) for line in open(f)
                ]
                rows = rows[workers:]  # the first pass of each worker warms up
                results[p]["img/s"].append(max(rates[1:]))
                for key in ("working", "waiting"):
                    results[p][key].append(statistics.median(row[key] for row in rows))
    return {p: {k: statistics.median(v) for k, v in fig.items()} for p, fig in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pack", required=True, help="a W_raw pack (raw uint8 records of one size)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5, help="per DataLoader run; the first warms up")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, nargs="+", default=sorted({2, WHOLE_BATCH_PREFETCH}))
    args = parser.parse_args()
    figures = in_process(args.pack, args.rounds)
    print(f"one core, ms per batch of {BATCH} (median of {args.rounds}):")
    for name, value in figures.items():
        print(f"  {name:<12} {value:7.3f}")
    total = sum(figures.values())
    print(
        f"  {'total':<12} {total:7.3f}  ({BATCH / total * 1e3:,.0f} img/s per core; the copy floor "
        f"alone {BATCH / figures['copy floor'] * 1e3:,.0f})"
    )
    print(f"DataLoader, {args.workers} workers (median of {args.rounds} alternating rounds):")
    for p, fig in with_workers(args.pack, args.workers, args.prefetch, args.rounds, args.epochs).items():
        print(
            f"  prefetch_factor={p}: {fig['img/s']:,.0f} img/s; per batch in a worker "
            f"{fig['working']:.3f} ms working, {fig['waiting']:.3f} ms waiting"
        )


if __name__ == "__main__":
    main()
