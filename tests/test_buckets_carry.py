"""leftover="carry"'s schedule (readers.bucket_order.carry_schedule): nothing padded or dropped,
every sample of each epoch's order read once, the short group waiting for a later epoch."""

from __future__ import annotations

import numpy as np
import pytest

from readers.bucket_order import carry_length, carry_schedule
from readers.order import global_order

OPTIONS = {"seed": 3, "shuffle": True, "block_size": 4, "buffer_size": 16}


def schedules(ids: np.ndarray, buckets: int, group: int, epochs: int) -> list[np.ndarray]:
    return [
        carry_schedule(ids, buckets, epoch=e, group_size=group, **OPTIONS)  # type: ignore[arg-type]
        for e in range(epochs)
    ]


@pytest.mark.parametrize("group", [6, 16, 40])  # 40: a bucket smaller than a group waits epochs
def test_carry_reads_each_buckets_epoch_stream_once_in_order(group):
    rng = np.random.default_rng(0)
    ids = rng.choice(3, size=90, p=[0.6, 0.3, 0.1]).astype(np.int64)
    counts = np.bincount(ids, minlength=3)
    epochs = 6
    got = schedules(ids, 3, group, epochs)
    for e, schedule in enumerate(got):
        assert len(schedule) == carry_length(counts, group, e)
        spans = ids[schedule].reshape(-1, group)
        assert (spans == spans[:, :1]).all()  # every group (group x batch) is one bucket
    read = np.concatenate(got)
    bases = [global_order(len(ids), epoch=e, **OPTIONS) for e in range(epochs)]  # type: ignore[arg-type]
    for b in range(3):
        # what each bucket's epochs hold, in each epoch's order, one epoch after another
        stream = np.concatenate([base[ids[base] == b] for base in bases])
        mine = read[ids[read] == b]
        assert np.array_equal(mine, stream[: len(mine)])  # nothing padded, dropped or reordered
        assert 0 <= len(stream) - len(mine) < group  # fewer than a group still waiting


def test_carry_is_a_function_of_seed_and_epoch():
    ids = np.arange(50, dtype=np.int64) % 2
    first = schedules(ids, 2, 8, 3)
    assert all(np.array_equal(a, b) for a, b in zip(first, schedules(ids, 2, 8, 3)))
    assert not np.array_equal(first[1][:16], first[2][:16])
    other = carry_schedule(ids, 2, epoch=1, group_size=8, **{**OPTIONS, "seed": 4})  # type: ignore[arg-type]
    assert not np.array_equal(first[1], other)
