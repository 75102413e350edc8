"""Bucketed reads (buckets=): one bucket per batch, the same bucket at each step on every rank,
every sample once per epoch (plus the documented padding), exact and elastic resume, boxes.

The set: one class folder per image, so a label names its sample exactly after any resize; images
at 16:9, 9:16, 4:3, 3:4 and 1:1."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from click.testing import CliRunner
from PIL import Image

from packer.cli import main
from readers import AspectBuckets, BucketList, OptionError, ResumeError, make_loader, mix, open_iterable
from readers.bucketing.bucket_order import bucket_schedule
from readers.bucketing.buckets import cover_window
from tests.readers.fields.test_boxes_read import FIELDS, check_frames
from tests.support.cocodata import coco_pack_args, make_coco

SHAPES = {(36, 64): 13, (64, 36): 11, (48, 64): 9, (64, 48): 6, (56, 56): 9}  # (h, w): images
BUCKETS = AspectBuckets(area=32 * 32, multiple=8)
BATCH = 4


def stored_size_of(label: int) -> tuple[int, int]:
    sizes = [s for s, n in SHAPES.items() for _ in range(n)]
    return sizes[label]


def write_aspect_images(src: Path) -> Path:
    """One class folder per image at ``src``, image i of size ``stored_size_of(i)``."""
    rng = np.random.default_rng(0)
    for index in range(sum(SHAPES.values())):
        h, w = stored_size_of(index)
        folder = src / f"c{index:03d}"
        folder.mkdir()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / "img.png")
    return src


@pytest.fixture(scope="module")
def aspects(tmp_path_factory) -> Path:
    return pack_aspects(tmp_path_factory)


def pack_aspects(tmp_path_factory) -> Path:
    """The set packed to LMDB: one folder (class) per image, the images at SHAPES."""
    src = write_aspect_images(tmp_path_factory.mktemp("aspects"))
    out = tmp_path_factory.mktemp("aspects-lmdb") / "ds"
    result = CliRunner().invoke(main, ["imagefolder", str(src), "--to", "lmdb", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return out


def expected_bucket(label: int, buckets=BUCKETS) -> tuple[int, int]:
    h, w = stored_size_of(label)
    return buckets.sizes[int(buckets.assign(np.asarray([h]), np.asarray([w]))[0])]


def read_rank(path, rank: int, world: int, workers: int, epoch: int = 0, **options) -> list[tuple]:
    """(shape, labels) of each step of one rank, checking each batch is one bucket."""
    it = open_iterable(path, batch_size=BATCH, buckets=options.pop("buckets", BUCKETS), seed=7,
                       rank=rank, world_size=world, **options)  # fmt: skip
    it.set_epoch(epoch)
    steps = []
    for images, labels in make_loader(it, num_workers=workers):
        shape = tuple(images.shape[2:])
        assert len(labels) == BATCH
        assert all(expected_bucket(int(label)) == shape for label in labels)
        steps.append((shape, labels.tolist()))
    return steps


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)])
def test_every_sample_once_per_epoch_one_bucket_per_step_on_every_rank(aspects, world, workers):
    ranks = [read_rank(aspects, r, world, workers) for r in range(world)]
    assert len({len(steps) for steps in ranks}) == 1  # equal steps: DDP never waits on a rank
    for step in zip(*ranks):
        assert len({shape for shape, _ in step}) == 1  # one bucket shape at each step on every rank
    seen = Counter(label for steps in ranks for _, labels in steps for label in labels)
    n = sum(SHAPES.values())
    assert set(seen) == set(range(n))  # every sample at least once
    # padding: each bucket's last group filled with its own samples, nothing more
    counts = Counter(expected_bucket(i) for i in range(n))
    group = world * BATCH
    padding = sum(-(-c // group) * group - c for c in counts.values())
    assert sum(seen.values()) - n == padding
    for label, times in seen.items():
        if times > 1:
            assert counts[expected_bucket(label)] % group  # only a bucket with a short group repeats


def test_drop_reads_every_sample_at_most_once_and_leaves_out_short_groups(aspects):
    buckets = AspectBuckets(area=32 * 32, multiple=8, leftover="drop")
    ranks = [read_rank(aspects, r, 2, 0, buckets=buckets) for r in range(2)]
    seen = Counter(label for steps in ranks for _, labels in steps for label in labels)
    n = sum(SHAPES.values())
    assert max(seen.values()) == 1
    counts = Counter(expected_bucket(i) for i in range(n))
    assert len(seen) == sum(c // (2 * BATCH) * 2 * BATCH for c in counts.values())


def test_order_is_a_function_of_seed_and_epoch_and_buckets_spread_over_the_epoch():
    ids = np.repeat(np.arange(3), [5000, 3000, 2000])
    args = dict(seed=1, shuffle=True, block_size=64, buffer_size=1024, group_size=32, leftover="pad")
    one = bucket_schedule(ids, 3, epoch=0, **args)
    assert np.array_equal(one, bucket_schedule(ids, 3, epoch=0, **args))
    assert not np.array_equal(one, bucket_schedule(ids, 3, epoch=1, **args))
    assert sorted(set(one.tolist())) == list(range(len(ids)))
    groups = ids[one].reshape(-1, 32)
    assert (groups == groups[:, :1]).all()  # each group is one bucket
    for bucket in range(3):
        where = np.flatnonzero(groups[:, 0] == bucket) / len(groups)
        assert where.min() < 0.1 and where.max() > 0.9  # not one run: spread over the epoch
        assert np.diff(where).max() < 0.1


def test_windows_cover_the_bucket_with_the_least_crop():
    assert cover_window((90, 160), (64, 112)) == (0, 1, 90, 158)  # 16:9 into 4:7: a sliver of width
    assert cover_window((160, 90), (112, 64)) == (1, 0, 158, 90)
    window = cover_window((100, 100), (64, 128))
    assert window == (25, 0, 50, 100)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(aspects, workers):
    def loader_of():
        it = open_iterable(aspects, batch_size=BATCH, buckets=BUCKETS, seed=7, flip=True)
        return make_loader(it, num_workers=workers)

    whole = loader_of()
    reference = [labels.tolist() for _ in range(2) for _, labels in whole]  # epochs 0 and 1
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
    assert got == reference and reference[: len(reference) // 2] != reference[len(reference) // 2 :]


def test_elastic_resume_two_ranks_to_one_covers_the_epoch_once(aspects):
    buckets = AspectBuckets(area=32 * 32, multiple=8, group=2)
    options = dict(batch_size=BATCH, buckets=buckets, seed=7, world_size=2)
    its = [open_iterable(aspects, rank=r, **options) for r in range(2)]
    first: list[int] = []
    state = None
    for r, it in enumerate(its):
        stream = iter(it)
        for _ in range(3):
            first += next(stream)[1].tolist()
        if r == 0:
            state = it.state_dict()
    one = open_iterable(aspects, batch_size=BATCH, buckets=buckets, seed=7, rank=0, world_size=1)
    one.load_state_dict(state)
    rest = []
    for images, labels in one:
        assert all(expected_bucket(int(x), buckets) == tuple(images.shape[2:]) for x in labels)
        rest += labels.tolist()
    whole = open_iterable(aspects, batch_size=BATCH, buckets=buckets, seed=7, rank=0, world_size=1)
    assert Counter(first + rest) == Counter(x for _, labels in whole for x in labels.tolist())
    # without a common group= the schedule differs: refused, naming buckets
    default = open_iterable(aspects, batch_size=BATCH, buckets=BUCKETS, seed=7, rank=0, world_size=1)
    with pytest.raises(ResumeError, match="group"):
        default.load_state_dict(state)


def test_per_sample_path_follows_the_buckets(aspects):
    it = open_iterable(aspects, buckets=BUCKETS, seed=7, fields=["geometry"])
    loader = make_loader(it, batch_size=BATCH, num_workers=2)
    seen = []
    for images, target in loader:
        assert all(expected_bucket(int(x)) == tuple(images.shape[2:]) for x in target["label"])
        seen += target["label"].tolist()
    assert set(seen) == set(range(sum(SHAPES.values())))


@pytest.fixture(scope="module")
def coco_lmdb(tmp_path_factory) -> Path:
    return pack_coco(tmp_path_factory)


def pack_coco(tmp_path_factory) -> Path:
    """80 COCO images with drawn rectangles as boxes (tests/support/cocodata.py), to LMDB in source order."""
    coco = make_coco(tmp_path_factory.mktemp("coco"), count=80, empty=2)
    out = tmp_path_factory.mktemp("coco-lmdb") / "ds"
    result = CliRunner().invoke(main, coco_pack_args(coco, "lmdb", out, "--order", "source", "-q"))
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("random_offset", [False, True])
def test_boxes_frame_the_drawn_rectangles_after_bucketing(coco_lmdb, random_offset):
    buckets = AspectBuckets(area=64 * 64, multiple=16, random_offset=random_offset)
    it = open_iterable(coco_lmdb, batch_size=8, buckets=buckets, flip=True, seed=2, fields=FIELDS)
    compared = shapes = 0
    seen_shapes = set()
    for images, target in make_loader(it, num_workers=2):
        seen_shapes.add(tuple(images.shape[2:]))
        for i in range(len(images)):
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
        shapes += 1
    assert len(seen_shapes) >= 3 and compared >= 80


def test_dali_fallback_gives_the_open_iterable_batches(aspects):
    from readers import dali_loader

    options = dict(batch_size=BATCH, buckets=BUCKETS, seed=7, flip=True)
    loader = dali_loader(aspects, device="dataloader", num_workers=2, **options)
    got = [(images.clone(), labels.clone()) for images, labels in loader]
    want = list(make_loader(open_iterable(aspects, **options), num_workers=0))
    assert len(got) == len(want) and len({tuple(i.shape[2:]) for i, _ in got}) > 1
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)  # DALI: tests/readers/dali/test_buckets_dali.py


def test_bucket_options_are_checked_at_construction(aspects):
    with pytest.raises(OptionError, match="drop crop= and resize="):
        open_iterable(aspects, batch_size=4, buckets=BUCKETS, crop=16)
    with pytest.raises(OptionError, match="leftover"):
        AspectBuckets(leftover="spill")
    with pytest.raises(OptionError, match="area"):
        AspectBuckets(area=10, multiple=64)
    with pytest.raises(OptionError, match="height, width"):
        open_iterable(aspects, batch_size=4, buckets=[32, 48])
    with pytest.raises(OptionError, match="multiple of world_size"):
        one_bucket = BucketList(bucket_sizes=[(32, 32)], group=3)
        open_iterable(aspects, batch_size=4, buckets=one_bucket, world_size=2)
    with pytest.raises(OptionError, match="open_iterable"):  # a mix's buckets change by epoch
        mix([aspects, aspects], batch_size=4, buckets=AspectBuckets(leftover="carry"))


def test_pack_info_prints_the_bucket_histogram(aspects):
    result = CliRunner().invoke(main, ["info", str(aspects), "--buckets", "32,8", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["buckets"]
    n = sum(SHAPES.values())
    assert sum(b["samples"] for b in plan["buckets"]) == n
    assert plan["kept"] > plan["kept_square"]


@pytest.mark.slow
@pytest.mark.parametrize("mode, workers", [("batch", 2), ("sample", 2)])
def test_kill_and_resume_trains_on_the_uninterrupted_batches(aspects, tmp_path, mode, workers):
    """kill -9 mid-epoch, at an epoch's first batch and right after a resume (support/train_script.py)."""
    from tests.readers.order.test_resume import train

    options = ("--mode", mode, "--buckets", "1024,8")
    (reference,) = train(aspects, tmp_path / "ref", *options)
    per_epoch = len(reference) // 2
    killed = ("--workers", str(workers), "--persistent")
    (resumed,) = train(aspects, tmp_path / "killed", *options, *killed, kill_at=(3, per_epoch, per_epoch + 1))
    assert resumed == reference
    assert len({len(step) for step in reference}) == 1  # whole batches of 4 (+ the epoch) throughout


def test_pack_show_draws_a_sheet_per_bucket(aspects, tmp_path):
    args = ["show", str(aspects), "-o", str(tmp_path / "s.png"), "--buckets", "32,8"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.glob("s-*.png"))
    buckets = {expected_bucket(i) for i in range(sum(SHAPES.values()))}
    assert written == sorted(f"s-{h}x{w}.png" for h, w in buckets)
    h, w = (int(v) for v in written[0][2:-4].split("x"))
    sheet = Image.open(tmp_path / written[0])
    assert sheet.height % 128 == 0 and sheet.width % round(128 * w / h) == 0  # tiles keep the bucket's ratio


WORLD = 2


def _rank_main(rank: int, path: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        it = open_iterable(path, batch_size=BATCH, buckets=BUCKETS, seed=3)  # rank from the group
        loader = make_loader(it, num_workers=1)
        steps = [[list(images.shape[2:]), labels.tolist()] for images, labels in loader]
        Path(out, f"rank{rank}.json").write_text(json.dumps(steps))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_gloo_group_reads_one_bucket_per_step(aspects, tmp_path):
    os.environ.pop("RANK", None)
    mp.spawn(_rank_main, args=(str(aspects), str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert len(ranks[0]) == len(ranks[1])
    assert all(a[0] == b[0] for a, b in zip(*ranks))
    seen = {x for steps in ranks for _, labels in steps for x in labels}
    assert seen == set(range(sum(SHAPES.values())))
