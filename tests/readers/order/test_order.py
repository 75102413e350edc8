"""The ordering module on its own: pure functions of (seed, epoch, sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from readers.order.epoch_order import OrderSpec, global_order, rank_order, worker_chunks


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


def interleave(parts: list[np.ndarray], unit: int) -> np.ndarray:
    """The job's consumption order: every rank's k-th chunk, rank by rank, for k = 0, 1, ..."""
    chunks = [[p[i : i + unit] for i in range(0, len(p), unit)] for p in parts]
    out = [c[k] for k in range(max(map(len, chunks), default=0)) for c in chunks if k < len(c)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize("n", [10, 11, 13, 44])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("unit", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_consume_one_global_order_as_a_common_prefix(n, world, unit, drop_last):
    order = global_order(n, seed=1, block_size=4)
    parts = [rank_order(order, r, world, drop_last, unit=unit) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    joined = interleave(parts, unit)
    if drop_last:
        np.testing.assert_array_equal(joined, order[: len(joined)])
        assert len(joined) == n - n % (world * unit)
    else:
        np.testing.assert_array_equal(joined[:n], order)
        assert len(joined) - n < world  # padding: fewer than one sample per rank
        np.testing.assert_array_equal(joined[n:], order[: len(joined) - n])  # padding wraps around


@pytest.mark.parametrize("n", [13, 44, 100])
@pytest.mark.parametrize("world, unit", [(1, 4), (2, 4), (3, 2), (4, 1)])
def test_a_later_start_is_the_rest_of_the_epoch(n, world, unit):
    spec = [OrderSpec(n, seed=2, block_size=4, rank=r, world_size=world, unit=unit) for r in range(world)]
    full = [s.epoch_order(5) for s in spec]
    for chunks in range(0, n // (world * unit) + 1):
        start = spec[0].position_after(chunks)
        for r in range(world):
            np.testing.assert_array_equal(spec[r].epoch_order(5, start), full[r][chunks * unit :])


@pytest.mark.parametrize("n", [13, 44, 101])
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 3), (4, 2)])
def test_elastic_resume_covers_the_epoch_exactly_once(n, before, after):
    unit = 4
    old = [OrderSpec(n, seed=7, block_size=8, rank=r, world_size=before, unit=unit) for r in range(before)]
    steps = max(1, len(old[0].epoch_order(0)) // unit // 2)
    seen = np.concatenate([s.epoch_order(0)[: steps * unit] for s in old])
    position = old[0].position_after(steps)
    new = [OrderSpec(n, seed=7, block_size=8, rank=r, world_size=after, unit=unit) for r in range(after)]
    rest = np.concatenate([s.epoch_order(0, position) for s in new])
    everything = np.concatenate([seen, rest])
    assert set(everything.tolist()) == set(range(n))
    assert len(everything) - n < before + after  # only the wrap-around padding repeats
    assert len({len(s.epoch_order(0, position)) for s in new}) == 1


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
