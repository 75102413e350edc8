"""The contract's read side, the readers' guarantees, with real DataLoader workers: every reading
path returns the stored samples; every sample once per epoch; the order a function of seed and
epoch only (not of workers, fork or spawn, or the world size); ranks and workers share it out;
a resume yields exactly the remaining batches; readers pickle without open handles.

Samples are identified by their stored bytes (decode="bytes"), so the tests check which sample
arrives where, not just labels.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import DeterministicSampler, open_dataset, open_iterable
from tests.support.format_contract.packs import SAMPLES


def identities(path) -> dict[bytes, int]:
    ds = open_dataset(path, decode="bytes")
    ids = {ds[i][0]: i for i in range(len(ds))}
    assert len(ids) == len(ds), "sample bytes must be unique to identify samples"
    return ids


def sample_order(it, num_workers=0, context=None) -> list[int]:
    ids = identities(it.path)
    loader = DataLoader(it, batch_size=None, num_workers=num_workers, multiprocessing_context=context)
    return [ids[image] for image, _ in loader]


def batch_list(it, num_workers):
    loader = DataLoader(it, batch_size=None, num_workers=num_workers)
    return [(images.clone(), labels.clone()) for images, labels in loader]


class ReadingContract:
    def test_every_reading_path_returns_the_stored_samples(self, small):
        ds = open_dataset(small, decode="numpy")
        want = [(np.asarray(image), int(label)) for image, label in ds]
        assert len(want) == SAMPLES and sorted({label for _, label in want}) == list(range(len(ds.classes)))
        mapped = [(np.asarray(x), int(y)) for x, y in DataLoader(ds, batch_size=None, num_workers=2)]
        assert len(mapped) == SAMPLES
        assert all(np.array_equal(a, b) and la == lb for (a, la), (b, lb) in zip(want, mapped))
        samples = open_iterable(small, shuffle=False, decode="numpy")
        got = [(np.asarray(x), int(y)) for x, y in DataLoader(samples, batch_size=None, num_workers=2)]
        assert len(got) == SAMPLES
        assert all(np.array_equal(a, b) and la == lb for (a, la), (b, lb) in zip(want, got))
        batches = open_iterable(small, shuffle=False, batch_size=8)
        loader = DataLoader(batches, batch_size=None, num_workers=2)
        images, labels = zip(*[(x.clone(), y.clone()) for x, y in loader])
        stacked = torch.cat(images).permute(0, 2, 3, 1).numpy()  # (N, C, H, W) batches -> (N, H, W, C)
        assert stacked.shape[0] == SAMPLES and np.array_equal(stacked, np.stack([image for image, _ in want]))
        assert torch.cat(labels).tolist() == [label for _, label in want]

    def test_the_order_is_the_same_for_any_workers_forked_or_spawned(self, small):
        it = open_iterable(small, shuffle=True, seed=5, decode="bytes", block_size=4, buffer_size=16)
        orders = {0: sample_order(it), **{w: sample_order(it, w, "fork") for w in (1, 2, 3)}}
        assert orders[0] == orders[1] == orders[2] == orders[3] == sample_order(it, 2, "spawn")
        assert sorted(orders[0]) == list(range(len(it)))
        assert orders[0] != list(range(len(it)))

    def test_batches_are_identical_for_any_num_workers(self, small):
        it = open_iterable(small, shuffle=True, seed=1, batch_size=5, block_size=4, buffer_size=16)
        reference = batch_list(it, 0)
        assert len(reference) == len(it)
        for workers in (1, 2, 3):
            batches = batch_list(it, workers)
            assert len(batches) == len(reference)
            for (a, la), (b, lb) in zip(reference, batches):
                assert torch.equal(a, b) and torch.equal(la, lb)

    @pytest.mark.parametrize("drop_last", [False, True])
    def test_global_order_is_the_same_for_any_world_size(self, small, drop_last):
        single = sample_order(open_iterable(small, seed=9, decode="bytes", world_size=1, rank=0))
        n = len(single)
        for world in (2, 4):
            options = {"seed": 9, "decode": "bytes", "world_size": world, "drop_last": drop_last}
            parts = [sample_order(open_iterable(small, rank=r, **options)) for r in range(world)]
            assert len({len(p) for p in parts}) == 1, "every rank must get the same number of samples"
            joined = [p[k] for k in range(len(parts[0])) for p in parts]  # ranks are dealt in turn
            if drop_last:
                assert joined == single[: len(joined)] and len(joined) == n - n % world
            else:
                assert joined[:n] == single and set(joined) == set(range(n))

    def test_the_order_is_a_function_of_seed_and_epoch(self, small):
        it = open_iterable(small, seed=0, decode="bytes")
        it.set_epoch(0)
        first = sample_order(it)
        it.set_epoch(1)
        second = sample_order(it, 2)
        assert first != second and sorted(first) == sorted(second) == list(range(SAMPLES))
        again = open_iterable(small, seed=0, decode="bytes")  # a new process would build it so
        again.set_epoch(1)
        assert sample_order(again) == second
        assert sample_order(open_iterable(small, seed=1, decode="bytes")) != first
        assert sample_order(open_iterable(small, shuffle=False, decode="bytes"), 2) == list(range(len(first)))

    def test_set_epoch_reaches_persistent_workers(self, small):
        it = open_iterable(small, seed=0, decode="bytes")
        ids = identities(small)
        loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
        seen = []
        for epoch in (0, 1):
            it.set_epoch(epoch)
            seen.append([ids[image] for image, _ in loader])
        reference = []
        for epoch in (0, 1):
            it.set_epoch(epoch)
            reference.append(sample_order(it))
        assert seen == reference and seen[0] != seen[1]

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_resume_yields_exactly_the_remaining_batches(self, small, num_workers):
        it = open_iterable(small, seed=4, batch_size=4)
        it.set_epoch(3)
        full = batch_list(it, num_workers)
        k = 3
        taken = []
        it.set_epoch(3)  # again (a new pass in this process would be the next epoch)
        for batch in DataLoader(it, batch_size=None, num_workers=num_workers):
            taken.append(batch)
            if len(taken) == k:
                break
        state = it.state_dict(consumed=k * 4) if num_workers else it.state_dict()
        assert state["position"] == k * 4 and state["epoch"] == 3
        resumed_it = open_iterable(small, seed=4, batch_size=4)
        resumed_it.load_state_dict(state)
        rest = batch_list(resumed_it, num_workers)
        assert len(rest) == len(full) - k
        for (a, la), (b, lb) in zip(full[k:], rest):
            assert torch.equal(a, b) and torch.equal(la, lb)

    @pytest.mark.parametrize("drop_last", [False, True])
    def test_last_partial_batch(self, small, drop_last):
        it = open_iterable(small, shuffle=False, batch_size=6, drop_last=drop_last)
        batches = batch_list(it, 2)
        n = len(open_dataset(small, decode="bytes"))
        sizes = [len(b[0]) for b in batches]
        assert len(batches) == len(it)
        if drop_last:
            assert all(s == 6 for s in sizes) and sum(sizes) == n - n % 6
        else:
            assert sizes[-1] == n % 6 or n % 6 == 0
            assert sum(sizes) == n

    def test_sampler_matches_the_iterable_order(self, small):
        ds = open_dataset(small, decode="bytes")
        ids = identities(small)
        sampler = DeterministicSampler(ds, seed=7, rank=1, world_size=2, block_size=4, buffer_size=8)
        sampler.set_epoch(2)
        it = open_iterable(small, seed=7, rank=1, world_size=2, block_size=4, buffer_size=8, decode="bytes")
        it.set_epoch(2)
        assert list(sampler) == sample_order(it) and len(sampler) == len(it)
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=2)
        assert [ids[image] for image, _ in loader] == list(sampler)

    def test_readers_pickle_without_open_handles(self, small):
        ds = open_dataset(small, decode="numpy")
        ds[0]
        assert ds.reader._handles, "reading opens a handle in this process"
        clone = pickle.loads(pickle.dumps(ds))
        assert clone.reader._handles == {}
        np.testing.assert_array_equal(clone[3][0], ds[3][0])
