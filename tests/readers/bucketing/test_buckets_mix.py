"""mix(buckets=): a mixed read whose batches are one bucket each, the same bucket at each step on
every rank, every position of the mixed epoch once (plus the documented padding), exact and
elastic resume, the order a function of (seed, epoch, datasets, weights).

Two packs of one class folder per image (so a mixed label names its dataset and sample): the
bucketed set of tests/readers/bucketing/test_buckets.py and a second one at other ratios and counts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from readers import AspectBuckets, OptionError, ResumeError, make_loader, mix

FIRST = {(36, 64): 13, (64, 36): 11, (48, 64): 9, (64, 48): 6, (56, 56): 9}  # (h, w): images
SECOND = {(40, 72): 10, (72, 40): 7, (56, 56): 5, (30, 60): 4}
BUCKETS = AspectBuckets(area=32 * 32, multiple=8)
BATCH = 4
SEED = 7


def sizes_of(shapes: dict[tuple[int, int], int]) -> list[tuple[int, int]]:
    return [s for s, n in shapes.items() for _ in range(n)]


def aspect_pack(root: Path, shapes: dict[tuple[int, int], int]) -> Path:
    """An LMDB pack of one class folder per image at ``shapes``: label i is the i-th size of ``sizes_of``."""
    rng = np.random.default_rng(len(shapes))
    src = root / "src"
    for index, (h, w) in enumerate(sizes_of(shapes)):
        folder = src / f"c{index:03d}"
        folder.mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / "img.png")
    out = root / "ds"
    result = CliRunner().invoke(main, ["imagefolder", str(src), "--to", "lmdb", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> list[Path]:
    return [aspect_pack(tmp_path_factory.mktemp(n), s) for n, s in (("a", FIRST), ("b", SECOND))]


MIXED_SIZES = sizes_of(FIRST) + sizes_of(SECOND)  # a mixed label (offset) indexes this list
WHOLE = [len(sizes_of(FIRST)), len(sizes_of(SECOND))]  # weights drawing each dataset once an epoch


def bucket_of(label: int, buckets=BUCKETS) -> tuple[int, int]:
    h, w = MIXED_SIZES[label]
    return buckets.sizes[int(buckets.assign(np.asarray([h]), np.asarray([w]))[0])]


def mixed(packs, buckets=BUCKETS, **options):
    options = {"batch_size": BATCH, "seed": SEED, "weights": WHOLE, **options}
    return mix(packs, buckets=buckets, **options)


def read_rank(packs, rank: int, world: int, workers: int, epoch: int = 0, **options) -> list[tuple]:
    """(shape, labels) of each step of one rank, checking each batch is one bucket."""
    buckets = options.get("buckets", BUCKETS)
    it = mixed(packs, rank=rank, world_size=world, **options)
    it.set_epoch(epoch)
    steps = []
    for images, labels in make_loader(it, num_workers=workers):
        shape = tuple(images.shape[2:])
        assert len(labels) == BATCH
        assert all(bucket_of(int(label), buckets) == shape for label in labels)
        steps.append((shape, labels.tolist()))
    return steps


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)])
def test_every_sample_once_per_epoch_one_bucket_per_step_on_every_rank(packs, world, workers):
    for epoch in (0, 1):
        ranks = [read_rank(packs, r, world, workers, epoch) for r in range(world)]
        assert len({len(steps) for steps in ranks}) == 1  # equal steps: DDP never waits on a rank
        for step in zip(*ranks):
            assert len({shape for shape, _ in step}) == 1  # one bucket shape at each step on every rank
        seen = Counter(label for steps in ranks for _, labels in steps for label in labels)
        n = len(MIXED_SIZES)
        assert set(seen) == set(range(n))  # both datasets whole (weights = their sizes), every sample
        counts = Counter(bucket_of(i) for i in range(n))
        group = world * BATCH
        padding = sum(-(-c // group) * group - c for c in counts.values())
        assert sum(seen.values()) - n == padding  # each bucket's short group filled, nothing more
        for label, times in seen.items():
            if times > 1:
                assert counts[bucket_of(label)] % group  # only a bucket with a short group repeats


def test_drop_reads_every_sample_at_most_once(packs):
    buckets = AspectBuckets(area=32 * 32, multiple=8, leftover="drop")
    ranks = [read_rank(packs, r, 2, 0, buckets=buckets) for r in range(2)]
    seen = Counter(label for steps in ranks for _, labels in steps for label in labels)
    assert max(seen.values()) == 1
    counts = Counter(bucket_of(i) for i in range(len(MIXED_SIZES)))
    assert len(seen) == sum(c // (2 * BATCH) * 2 * BATCH for c in counts.values())


def test_the_order_is_a_function_of_seed_epoch_datasets_and_weights(packs):
    def batches(epoch=0, **options):
        it = mixed(packs, **options)
        it.set_epoch(epoch)
        return [labels.tolist() for _, labels in it]

    one = batches()
    assert one == batches()  # rebuilt from nothing: the same
    assert one != batches(epoch=1) and one != batches(seed=SEED + 1)
    assert one != batches(weights=[1, 1])  # other quotas, another mixed epoch
    assert batches(weights=[1, 1]) == batches(weights=[2, 2])  # the same proportions
    first = [np.mean([x < WHOLE[0] for x in labels]) for labels in one]
    assert 0 < np.mean(first) < 1 and len(set(map(tuple, one))) == len(one)
    # buckets spread over the epoch: the most common shape's batches are not one run
    shapes = [bucket_of(labels[0]) for labels in one]
    common = Counter(shapes).most_common(1)[0][0]
    where = np.flatnonzero([s == common for s in shapes]) / len(shapes)
    assert where.min() < 0.25 and where.max() > 0.75


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(packs, workers):
    def loader_of():  # equal weights: the mixed epoch and its length change from epoch to epoch
        return make_loader(mixed(packs, weights=[1, 1], flip=True), num_workers=workers)

    whole = loader_of()
    epochs = [[labels.tolist() for _, labels in whole] for _ in range(2)]
    reference = epochs[0] + epochs[1]
    loader = loader_of()
    got = []
    for step, (_, labels) in enumerate(loader):
        got.append(labels.tolist())
        if step == 4:
            state = loader.state_dict()
            break
    del loader  # "killed": a fresh loader resumes from the saved state
    resumed = loader_of()
    resumed.load_state_dict(state)
    got += [labels.tolist() for _, labels in resumed]
    got += [labels.tolist() for _, labels in resumed]  # and the next epoch, whole
    assert got == reference and epochs[0] != epochs[1]


def test_elastic_resume_two_ranks_to_one_covers_the_epoch_once(packs):
    buckets = AspectBuckets(area=32 * 32, multiple=8, group=2)
    its = [mixed(packs, buckets=buckets, rank=r, world_size=2) for r in range(2)]
    first: list[int] = []
    state = None
    for r, it in enumerate(its):
        stream = iter(it)
        for _ in range(3):
            first += next(stream)[1].tolist()
        if r == 0:
            state = it.state_dict()
    one = mixed(packs, buckets=buckets, rank=0, world_size=1)
    one.load_state_dict(state)
    rest = []
    for images, labels in one:
        assert all(bucket_of(int(x), buckets) == tuple(images.shape[2:]) for x in labels)
        rest += labels.tolist()
    whole = mixed(packs, buckets=buckets, rank=0, world_size=1)
    assert Counter(first + rest) == Counter(x for _, labels in whole for x in labels.tolist())
    with pytest.raises(ResumeError, match="group"):  # without a common group= the schedule differs
        mixed(packs, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ResumeError, match="buckets"):  # nor does an unbucketed mix take it
        mix(packs, batch_size=BATCH, seed=SEED, weights=WHOLE, resize=32, crop=32).load_state_dict(state)


def test_per_sample_path_follows_the_buckets(packs):
    it = mix(packs, buckets=BUCKETS, seed=SEED, weights=WHOLE)
    seen = []
    for images, labels in make_loader(it, batch_size=BATCH, num_workers=2):
        assert all(bucket_of(int(x)) == tuple(images.shape[2:]) for x in labels)
        seen += labels.tolist()
    assert set(seen) == set(range(len(MIXED_SIZES)))


def test_carry_is_refused_in_a_mix(packs):
    with pytest.raises(OptionError, match="open_iterable"):
        mixed(packs, buckets=AspectBuckets(area=32 * 32, multiple=8, leftover="carry"))


def test_a_token_budget_is_refused_in_a_mix(packs):
    from readers import TokenBudget

    with pytest.raises(OptionError, match="TokenBudget"):
        mixed(packs, buckets=TokenBudget(patch=8, budget=256, seq_lens=(16, 32)))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_kill_and_resume_trains_on_the_uninterrupted_batches(packs, tmp_path, mode):
    """kill -9 mid-epoch, at epoch 1's first batch and right after a resume (support/train_script.py)."""
    from tests.readers.order.test_resume import train

    options = ("--mode", mode, "--buckets", "1024,8", "--mix-with", str(packs[1]))
    (reference,) = train(packs[0], tmp_path / "ref", *options)
    first_epoch = sum(1 for step in reference if step[0] == 0)
    assert 0 < first_epoch < len(reference)
    killed = ("--workers", "2", "--persistent")
    kills = (3, first_epoch, first_epoch + 1)
    (resumed,) = train(packs[0], tmp_path / "killed", *options, *killed, kill_at=kills)
    assert resumed == reference
