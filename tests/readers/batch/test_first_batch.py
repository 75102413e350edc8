"""The first batch of a DataLoader worker: no garbage collection over the parent's heap.

A forked worker's first full collection walks every object inherited from the parent (torch's
whole heap) and its copy-on-write faults cost 0.3-0.6 s of the first batch (measured; the time
itself belongs to packer/bench/suites/fastpath.py, not to a unit test). The worker's ring freezes the
inherited objects first, so what is checked here is that the freeze happens before the batch
path's first allocation-heavy step, in every worker, and batches stay right.
"""

from __future__ import annotations

import gc

import torch
from torch.utils.data import DataLoader, IterableDataset

from readers import RandomResizedCrop, open_iterable


class FreezeReport(IterableDataset):
    """The wrapped batches (in a worker: ring leases, unpacked in the main process), each with
    the worker's frozen-object count when it was made."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for batch in self.inner:
            yield batch, gc.get_freeze_count()


def test_workers_freeze_the_inherited_heap_before_their_first_batch(packed):
    path = packed("lmdb", resize=48, encode="jpeg")
    options = dict(batch_size=8, shuffle=True, seed=1, crop=RandomResizedCrop(24), flip=True)
    assert gc.get_freeze_count() == 0  # the main process is left alone
    loader = DataLoader(FreezeReport(open_iterable(path, **options)), batch_size=None, num_workers=2)
    got = [(images.clone(), frozen) for (images, _), frozen in loader]
    assert len(got) >= 4 and all(frozen > 1000 for _, frozen in got)  # torch alone is ~100k objects
    assert gc.get_freeze_count() == 0
    want = [images.clone() for images, _ in open_iterable(path, **options)]  # the main process
    assert len(want) == len(got) and all(torch.equal(a, b) for (a, _), b in zip(got, want))


def test_ring_slots_are_made_in_shared_memory_without_a_copy(packed, monkeypatch):
    """``share_memory_()`` on a fresh tensor faults in ordinary pages, then copies them into shared
    memory: twice the page faults of a worker's first batch. The slots must not be made that way."""
    plain = torch.Tensor.share_memory_

    def copying(self):
        if self.numel() > 4096:  # the ring's flag array (a few ints) may still be made this way
            raise AssertionError("a batch slot was made by copying an ordinary tensor into shared memory")
        return plain(self)

    monkeypatch.setattr(torch.Tensor, "share_memory_", copying)  # forked workers inherit the patch
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    loader = DataLoader(open_iterable(path, batch_size=8, layout="HWC"), batch_size=None, num_workers=2)
    got = torch.cat([images.clone() for images, _ in loader])
    want = torch.cat([images.clone() for images, _ in open_iterable(path, batch_size=8, layout="HWC")])
    assert got.shape == (44, 32, 32, 3) and torch.equal(got, want)
