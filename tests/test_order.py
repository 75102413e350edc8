"""The ordering module on its own: pure functions of (seed, epoch, sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from readers.order import OrderSpec, global_order, rank_order, worker_chunks


@pytest.mark.parametrize("n", [1, 7, 64, 1000])
@pytest.mark.parametrize("block, buffer", [(1, 0), (8, 0), (8, 32), (64, 4096)])
def test_global_order_is_a_permutation_decided_by_seed_and_epoch(n, block, buffer):
    a = global_order(n, seed=3, epoch=1, block_size=block, buffer_size=buffer)
    assert sorted(a.tolist()) == list(range(n))
    np.testing.assert_array_equal(a, global_order(n, seed=3, epoch=1, block_size=block, buffer_size=buffer))
    if n >= 64:
        assert not np.array_equal(a, global_order(n, seed=3, epoch=2, block_size=block, buffer_size=buffer))
        assert not np.array_equal(a, global_order(n, seed=4, epoch=1, block_size=block, buffer_size=buffer))


def test_unshuffled_order_is_source_order():
    np.testing.assert_array_equal(global_order(10, shuffle=False), np.arange(10))


def test_blocks_stay_contiguous_without_a_buffer():
    order = global_order(100, seed=0, block_size=10)
    blocks = order.reshape(10, 10)
    for block in blocks:
        assert block[0] % 10 == 0
        np.testing.assert_array_equal(block, np.arange(block[0], block[0] + 10))


def test_shuffle_buffer_only_mixes_within_windows():
    order = global_order(100, seed=0, block_size=10, buffer_size=20)
    plain = global_order(100, seed=0, block_size=10)
    rng_blocks = {tuple(sorted(w)) for w in plain.reshape(5, 20).tolist()}
    # Same block permutation, then each window of 2 blocks shuffled inside itself.
    assert {tuple(sorted(w)) for w in order.reshape(5, 20).tolist()} == rng_blocks
    assert not np.array_equal(order, plain)


@pytest.mark.parametrize("n", [10, 11, 13, 44])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_equal_disjoint_slices_of_one_global_order(n, world, drop_last):
    order = global_order(n, seed=1, block_size=4)
    parts = [rank_order(order, r, world, drop_last) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    joined = np.concatenate(parts)
    if drop_last:
        np.testing.assert_array_equal(joined, order[: len(joined)])
        assert len(joined) == n - n % world
    else:
        np.testing.assert_array_equal(joined[:n], order)
        assert set(joined.tolist()) == set(range(n))  # every sample at least once
        np.testing.assert_array_equal(joined[n:], order[: len(joined) - n])  # padding wraps around


@pytest.mark.parametrize("positions, chunk", [(10, 3), (64, 8), (5, 64)])
def test_worker_chunks_cover_everything_in_round_robin(positions, chunk):
    for workers in (1, 2, 3):
        spans = [list(worker_chunks(positions, chunk, w, workers, drop_last=False)) for w in range(workers)]
        interleaved = []
        for i in range(max(len(s) for s in spans)):
            interleaved += [s[i] for s in spans if i < len(s)]
        covered = [p for a, b in interleaved for p in range(a, b)]
        assert covered == list(range(positions))


def test_order_spec_samples_per_rank():
    spec = OrderSpec(num_samples=10, world_size=4, rank=3)
    assert spec.samples_per_rank == 3 and len(spec.epoch_order(0)) == 3
    assert OrderSpec(num_samples=10, world_size=4, rank=3, drop_last=True).samples_per_rank == 2
