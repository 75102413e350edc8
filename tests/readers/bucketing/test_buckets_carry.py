"""leftover="carry" (readers.bucketing.bucket_order.carry_schedule): nothing padded or dropped, every sample
of each epoch's order read once, the short group waiting for a later epoch; on the reading path:
1, 2, 4 ranks with 0 and 2 workers, one bucket shape per step, exact and elastic resume across
epochs of different lengths, kill -9 and resume, `pack info --buckets --leftover carry`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main
from readers import AspectBuckets, ResumeError, make_loader, open_iterable
from readers.bucketing.bucket_order import carry_length, carry_schedule
from readers.formats import open_reader
from readers.order.epoch_order import global_order
from tests.readers.bucketing.test_buckets_mix import FIRST, MIXED_SIZES, aspect_pack

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


# -- leftover="carry" on the reading paths ------------------------------------------------------
CARRY = AspectBuckets(area=32 * 32, multiple=8, leftover="carry")
BATCH = 4
SEED = 7
EPOCHS = 3


@pytest.fixture(scope="module")
def aspects(tmp_path_factory) -> Path:
    return aspect_pack(tmp_path_factory.mktemp("carry"), FIRST)


def labels_by_index(path) -> np.ndarray:
    reader = open_reader(path)
    try:
        return np.asarray([r.label for r in reader.read_block(0, len(reader))], dtype=np.int64)
    finally:
        reader.close()


def bucket_of(label: int, buckets=CARRY) -> tuple[int, int]:
    h, w = MIXED_SIZES[label]  # the first pack's labels come first in MIXED_SIZES
    return buckets.sizes[int(buckets.assign(np.asarray([h]), np.asarray([w]))[0])]


def carried(path, rank: int, world: int, **options) -> open_iterable:
    options = {"batch_size": BATCH, "buckets": CARRY, "seed": SEED, **options}
    return open_iterable(path, rank=rank, world_size=world, **options)


def epoch_steps(path, world: int, workers: int, epoch: int, **options) -> list[list[tuple]]:
    """Each rank's (shape, labels) per step of ``epoch``, checking one bucket per batch and len()."""
    ranks = []
    for rank in range(world):
        it = carried(path, rank, world, **options)
        it.set_epoch(epoch)
        expected = len(it)  # this epoch's steps, which change by epoch
        loader = make_loader(it, num_workers=workers)
        steps = []
        for images, labels in loader:
            shape = tuple(images.shape[2:])
            assert len(labels) == BATCH and all(bucket_of(int(x)) == shape for x in labels)
            steps.append((shape, labels.tolist()))
        assert len(steps) == expected
        ranks.append(steps)
    return ranks


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)])
def test_carry_reads_every_sample_once_per_epoch_stream_on_every_rank(aspects, world, workers):
    label_of = labels_by_index(aspects)
    order = carried(aspects, 0, world).order
    n = len(label_of)
    read: list[int] = []
    lengths = []
    for epoch in range(EPOCHS):
        ranks = epoch_steps(aspects, world, workers, epoch)
        assert len({len(steps) for steps in ranks}) == 1  # equal steps: DDP never waits on a rank
        for step in zip(*ranks):
            assert len({shape for shape, _ in step}) == 1  # one bucket shape at each step on every rank
            read += [x for _, labels in step for x in labels]  # the ranks take turns by batches
        lengths.append(len(ranks[0]))
    assert len(set(lengths)) > 1  # the carried groups change the epoch's length
    options = dict(shuffle=True, block_size=order.block_size, buffer_size=order.buffer_size)
    bases = [label_of[global_order(n, seed=SEED, epoch=e, **options)] for e in range(EPOCHS)]
    buckets = np.asarray([CARRY.sizes.index(bucket_of(x)) for x in range(n)])
    got = np.asarray(read)
    for b in np.unique(buckets).tolist():
        # each bucket's epochs, in each epoch's order, one after another: read as a prefix, nothing
        # padded, dropped or read twice, fewer than a group (world x batch) still waiting
        stream = np.concatenate([base[buckets[base] == b] for base in bases])
        mine = got[buckets[got] == b]
        assert np.array_equal(mine, stream[: len(mine)])
        assert 0 <= len(stream) - len(mine) < world * BATCH


@pytest.mark.parametrize("workers", [0, 2])
def test_carry_resume_mid_epoch_is_exact(aspects, workers):
    buckets = AspectBuckets(area=32 * 32, multiple=8, group=2, leftover="carry")  # lengths vary by 8s

    def loader_of():
        return make_loader(carried(aspects, 0, 1, buckets=buckets, flip=True), num_workers=workers)

    whole = loader_of()
    epochs = [[labels.tolist() for _, labels in whole] for _ in range(EPOCHS)]
    assert len({len(e) for e in epochs}) > 1
    reference = [labels for epoch in epochs for labels in epoch]
    longest = max(range(1, EPOCHS), key=lambda e: len(epochs[e]))
    assert len(epochs[longest]) > len(epochs[0]) + 1  # its last step lies past epoch 0's end
    last = sum(len(e) for e in epochs[:longest]) + len(epochs[longest]) - 1
    for stop in (3, len(epochs[0]) + 2, last):  # mid-epoch 0, and in later epochs of other lengths
        loader = loader_of()
        got = []
        for _ in range(EPOCHS):
            for _, labels in loader:
                got.append(labels.tolist())
                if len(got) == stop:
                    state = loader.state_dict()
                    break
            if len(got) == stop:
                break
        del loader  # "killed": a fresh loader resumes from the saved state
        resumed = loader_of()
        resumed.load_state_dict(state)
        while len(got) < len(reference):
            before = len(got)
            got += [labels.tolist() for _, labels in resumed]
            assert len(got) > before
        assert got == reference


def test_carry_elastic_resume_two_ranks_to_one_covers_the_epoch_once(aspects):
    buckets = AspectBuckets(area=32 * 32, multiple=8, group=2, leftover="carry")
    order = carried(aspects, 0, 2, buckets=buckets).order
    lengths = [len(order.schedule(e)) for e in range(12)]
    epoch = int(np.argmax(lengths))  # carried groups in: its last steps lie past epoch 0's end
    assert lengths[epoch] >= lengths[0] + 2 * 8
    first: list[int] = []
    state = None
    for r in range(2):
        it = carried(aspects, r, 2, buckets=buckets)
        it.set_epoch(epoch)
        stream = iter(it)
        for _ in range(lengths[epoch] // (2 * BATCH) - 1):  # past the end of epoch 0's length
            first += next(stream)[1].tolist()
        if r == 0:
            state = it.state_dict()
    one = carried(aspects, 0, 1, buckets=buckets)
    one.load_state_dict(state)
    rest = []
    for images, labels in one:
        assert all(bucket_of(int(x), buckets) == tuple(images.shape[2:]) for x in labels)
        rest += labels.tolist()
    whole = carried(aspects, 0, 1, buckets=buckets)
    whole.set_epoch(epoch)
    assert Counter(first + rest) == Counter(x for _, labels in whole for x in labels.tolist())
    with pytest.raises(ResumeError, match="buckets"):  # a state of the pad rule is another schedule
        padded = AspectBuckets(area=32 * 32, multiple=8, group=2)
        carried(aspects, 0, 1, buckets=padded).load_state_dict(state)


def test_pack_info_reports_no_leftovers_for_carry(aspects):
    args = ["info", str(aspects), "--buckets", "32,8", "--batch-size", str(BATCH), "--world-size", "2"]
    result = CliRunner().invoke(main, [*args, "--leftover", "carry", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["buckets"]
    counts = Counter(bucket_of(x) for x in range(sum(FIRST.values())))
    assert plan["leftover"] == "carry" and plan["leftovers"] == 0
    assert plan["carried"] == sum(c % (2 * BATCH) for c in counts.values()) > 0
    text = CliRunner().invoke(main, [*args, "--leftover", "carry"]).output
    assert f"0 samples padded or dropped ({plan['carried']} carried" in text
    padded = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["buckets"]
    assert padded["leftovers"] == sum(-c % (2 * BATCH) for c in counts.values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_carry_kill_and_resume_trains_on_the_uninterrupted_batches(aspects, tmp_path, mode):
    """kill -9 mid-epoch, at epoch 1's first batch and right after a resume (support/train_script.py)."""
    from tests.readers.order.test_resume import train

    options = ("--mode", mode, "--buckets", "1024,8,,carry", "--epochs", "3")
    (reference,) = train(aspects, tmp_path / "ref", *options)
    first_epoch = sum(1 for step in reference if step[0] == 0)
    assert len({step[0] for step in reference}) == 3
    killed = ("--workers", "2", "--persistent")
    kills = (3, first_epoch, first_epoch + 1)
    (resumed,) = train(aspects, tmp_path / "killed", *options, *killed, kill_at=kills)
    assert resumed == reference
