"""Many ranks: a real gloo group reads every sample once, resumes elastically, and the order a rank
computes for itself is the one global order (packer/bench/suites/many_ranks.py at a small size)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from packer.bench.suites import many_ranks
from readers.order.epoch_order import OrderSpec, global_order, order_at, rank_order
from tests.support.formats import numbered_and_not


def old_epoch_order(spec: OrderSpec, epoch: int, start: int) -> np.ndarray:
    """The computation OrderSpec.epoch_order made before order_at: the whole order, then the rank's."""
    whole = global_order(spec.num_samples, seed=spec.seed, epoch=epoch, shuffle=spec.shuffle,
                         block_size=spec.block_size, buffer_size=spec.buffer_size)  # fmt: skip
    return rank_order(whole, spec.rank, spec.world_size, spec.drop_last, unit=spec.unit, start=start)


WINDOWS = [(1, 0), (1, 2), (7, 0), (8, 32), (64, 4096), (64, 100), (3, 10**6)]  # (block, buffer)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1000, 4097, 20011])
@pytest.mark.parametrize("block, buffer", WINDOWS)
def test_order_at_is_the_global_order_at_those_positions(n, block, buffer):
    for seed in (0, 1, 12345):
        whole = global_order(n, seed=seed, epoch=seed + 2, block_size=block, buffer_size=buffer)
        options = {"seed": seed, "epoch": seed + 2, "block_size": block, "buffer_size": buffer}
        np.testing.assert_array_equal(order_at(np.arange(n), n, **options), whole)
        some = np.random.default_rng(seed).integers(0, n, 37)
        np.testing.assert_array_equal(order_at(some, n, **options), whole[some])


@pytest.mark.parametrize("n", [13, 5000, 100_003])
@pytest.mark.parametrize("world, unit", [(1, 1), (4, 64), (16, 256), (12, 7)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_ranks_order_is_unchanged(n, world, unit, drop_last):
    for seed, rank in ((0, 0), (7, world - 1), (99, world // 2)):
        spec = OrderSpec(n, seed=seed, block_size=64, buffer_size=4096, rank=rank, world_size=world,
                         drop_last=drop_last, unit=unit)  # fmt: skip
        for start in (0, spec.position_after(1), n // 2):
            np.testing.assert_array_equal(spec.epoch_order(3, start), old_epoch_order(spec, 3, start))
    unshuffled = OrderSpec(n, shuffle=False, rank=0, world_size=world, unit=unit)
    np.testing.assert_array_equal(unshuffled.epoch_order(0), old_epoch_order(unshuffled, 0, 0))


def test_a_rank_builds_no_epoch_long_array():
    n, world = 1_280_000, 16
    spec = OrderSpec(n, seed=1, block_size=64, buffer_size=4096, rank=3, world_size=world, unit=256)
    tracemalloc.start()
    try:
        mine = spec.epoch_order(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(mine) == n // world
    # less than one int64 array of the epoch (10 MB); the old computation held ~5 of them at once
    assert peak < 8 * n, f"peak {peak / 1e6:.1f} MB for a rank's {len(mine)} positions"


def test_checkpoint_step_leaves_no_padding():
    for samples, ranks, resume in ((5000, 4, 3), (100_000, 16, 12), (1_280_000, 16, 12)):
        step = many_ranks.checkpoint_step(samples, ranks, resume)
        assert 1 <= step <= samples // ranks // many_ranks.BATCH
        assert (samples - step * ranks * many_ranks.BATCH) % resume == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
# Every format keeps the ranks' share-out in the format contract (ranks simulated); this real gloo
# run takes one format whose samples carry their dataset index (tar keys) and one whose do not.
@pytest.mark.parametrize("fmt", numbered_and_not())
def test_four_ranks_read_each_sample_once_and_resume_on_three(tmp_path, fmt):
    samples, ranks, resume = 5000, 4, 3
    result = many_ranks.measure(fmt, samples, ranks, resume, 2, tmp_path)
    # the module's verdicts, and the same checks made here from the indices the ranks saved
    assert result.exactly_once and result.equal_counts and result.resume_exact, result
    first = many_ranks.read_indices(tmp_path / "run-first", ranks)
    assert {len(p) for p in first} == {samples // ranks}
    assert sorted(np.concatenate(first).tolist()) == list(range(samples))
    step = many_ranks.checkpoint_step(samples, ranks, resume) * many_ranks.BATCH
    rest = many_ranks.read_indices(tmp_path / "run-resumed", resume)
    assert {len(p) for p in rest} == {(samples - step * ranks) // resume}
    union = np.concatenate([p[:step] for p in first] + rest)
    assert sorted(union.tolist()) == list(range(samples))
    assert 0 < result.state_json_bytes < 4096 and 0 < result.state_torch_bytes < 8192
    assert 50 < result.pss_mib < 2000 and result.first_batch_s > 0


def test_hdf5_images_are_read_without_a_chunk_cache_unless_compressed(packed):
    from readers.formats import open_reader

    spec = {"resize": 40, "encode": "jpeg"}
    for options, cached in (({}, False), ({"compression": "gzip"}, True)):
        reader = open_reader(packed("hdf5", options=options, **spec))
        reader.read_block(0, 8)
        cache_bytes = reader.handle(0).images.id.get_access_plist().get_chunk_cache()[1]
        assert (cache_bytes > 0) == cached, (options, cache_bytes)
