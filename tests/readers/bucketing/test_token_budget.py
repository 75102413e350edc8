"""Token-budget reads (buckets=TokenBudget(...)): batches of budget // L images at one patch grid
of at most L patches, every batch within the budget, the same cell at each step on every rank,
every sample once per epoch (plus the documented padding), exact and elastic resume.

The set is tests/readers/bucketing/test_buckets.py's: one class folder per image, so a label names its sample;
images at 16:9, 9:16, 4:3, 3:4 and 1:1."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from readers import OptionError, ResumeError, TokenBudget, make_loader, open_iterable
from readers.bucketing.token_budget import patch_grids
from readers.bucketing.token_order import EMPTY, token_summary
from tests.readers.bucketing.test_buckets import SHAPES, pack_aspects, pack_coco, stored_size_of
from tests.readers.fields.test_boxes_read import FIELDS, check_frames

PATCH = 8
BUDGET = TokenBudget(patch=PATCH, budget=72, seq_lens=(16, 36))  # batches of 4 (L=16) and 2 (L=36)
N = sum(SHAPES.values())


@pytest.fixture(scope="module")
def aspects(tmp_path_factory) -> Path:
    return pack_aspects(tmp_path_factory)


def nearest_grid(label: int, seq_len: int, budget=BUDGET) -> tuple[int, int]:
    """The grid of ``seq_len`` nearest the sample's stored aspect ratio, worked out here apart."""
    h, w = stored_size_of(label)
    grids = budget.grids[budget.seq_lens.index(seq_len)]
    return min(grids, key=lambda g: abs(np.log(h / w) - np.log(g[0] / g[1])))


def check_batch(images: torch.Tensor, labels: torch.Tensor, budget=BUDGET) -> tuple:
    """The batch's (seq_len, shape, size), after checking it against the budget and its images."""
    height, width = images.shape[2:]
    assert height % budget.patch == 0 and width % budget.patch == 0
    patches = (height // budget.patch) * (width // budget.patch)
    assert len(labels) * patches <= budget.budget  # the budget holds for every batch
    grid = (height // budget.patch, width // budget.patch)
    # the lengths this batch can be read at: its grid is one of theirs, nearest every image's ratio
    seq_len = [
        n for n, b, grids in zip(budget.seq_lens, budget.batch_sizes, budget.grids)
        if len(labels) <= b and grid in grids and all(nearest_grid(int(x), n, budget) == grid for x in labels)
    ]  # fmt: skip
    assert seq_len and patches <= seq_len[0]
    return seq_len[0], (int(height), int(width)), len(labels)


def read_rank(path, rank: int, world: int, workers: int, epoch: int = 0, budget=BUDGET, **options):
    it = open_iterable(path, buckets=budget, seed=7, rank=rank, world_size=world, **options)
    it.set_epoch(epoch)
    steps = []
    for images, labels in make_loader(it, num_workers=workers):
        steps.append((check_batch(images, labels, budget), labels.tolist()))
    assert len(steps) == len(it)
    return steps, it.order


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (2, 2), (4, 0), (4, 2)])
def test_every_sample_once_per_epoch_one_cell_per_step_on_every_rank(aspects, world, workers):
    read = [read_rank(aspects, r, world, workers) for r in range(world)]
    ranks = [steps for steps, _ in read]
    order = read[0][1]
    assert len({len(steps) for steps in ranks}) == 1  # equal steps: DDP never waits on a rank
    for step in zip(*ranks):
        assert len({shape for shape, _ in step}) == 1  # one length, shape and batch size per step
    seen = Counter(x for steps in ranks for _, labels in steps for x in labels)
    assert set(seen) == set(range(N))  # every sample at least once
    assert sum(seen.values()) - N == order.leftovers  # the padding, and nothing more
    cells = {(shape[0], shape[1]) for steps in ranks for shape, _ in steps}
    assert order.leftovers <= (world - 1) * len(cells)  # "shrink": under group repeats per cell
    assert {shape[0] for steps in ranks for shape, _ in steps} == {16, 36}
    if world == 1:
        assert max(seen.values()) == 1  # exactly once
    sizes = {shape[2] for steps in ranks for shape, _ in steps}
    assert set(BUDGET.batch_sizes) < sizes  # full batches, and the smaller last ones of some cells


def test_pad_fills_each_cells_last_group_to_full_batches(aspects):
    budget = TokenBudget(patch=PATCH, budget=72, seq_lens=(16, 36), leftover="pad")
    read = [read_rank(aspects, r, 2, 2, budget=budget) for r in range(2)]
    seen = Counter(x for steps, _ in read for _, labels in steps for x in labels)
    assert set(seen) == set(range(N)) and sum(seen.values()) - N == read[0][1].leftovers > 0
    assert {shape[2] for steps, _ in read for shape, _ in steps} == set(budget.batch_sizes)


def test_drop_reads_every_sample_at_most_once(aspects):
    budget = TokenBudget(patch=PATCH, budget=72, seq_lens=(16, 36), leftover="drop")
    read = [read_rank(aspects, r, 2, 0, budget=budget) for r in range(2)]
    seen = Counter(x for steps, _ in read for _, labels in steps for x in labels)
    assert max(seen.values()) == 1 and N - len(seen) == read[0][1].leftovers


def test_the_schedule_is_a_function_of_seed_and_epoch_and_lengths_vary_per_epoch(aspects):
    it = open_iterable(aspects, buckets=BUDGET, seed=7)
    order = it.order
    one = order.schedule(0)
    assert np.array_equal(one, open_iterable(aspects, buckets=BUDGET, seed=7).order.schedule(0))
    assert not np.array_equal(one, order.schedule(1))
    assert len(one) == len(order.schedule(1)) == order.num_samples  # every epoch as long
    slots = one.reshape(-1, BUDGET.slots)
    sizes = (slots != EMPTY).sum(axis=1)
    assert set(BUDGET.batch_sizes) <= set(sizes.tolist())
    assert ((slots != EMPTY) == (np.arange(BUDGET.slots) < sizes[:, None])).all()  # images first
    # a sample's length changes from epoch to epoch: its cell is drawn in each epoch's order
    lengths = np.stack([[BUDGET.cells[c][0] for c in order.cells(e)] for e in range(6)])
    assert (lengths.min(axis=0) != lengths.max(axis=0)).sum() > N // 4
    # the share of each length follows its batch size (NaFlex draws a length per batch)
    per_length = np.bincount(lengths[0], minlength=2)
    assert per_length[0] > per_length[1]


def test_grids_fit_their_length_and_none_fits_in_another():
    assert patch_grids(16, 4) == ((8, 2), (5, 3), (4, 4), (3, 5), (2, 8))
    for seq_len in (16, 36, 196, 256):
        grids = patch_grids(seq_len, 3.0)
        assert all(r * c <= seq_len and max(r / c, c / r) <= 3.0 for r, c in grids)
        assert not any(a != b and a[0] <= b[0] and a[1] <= b[1] for a in grids for b in grids)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(aspects, workers):
    def loader_of():
        return make_loader(open_iterable(aspects, buckets=BUDGET, seed=7, flip=True), num_workers=workers)

    whole = loader_of()
    reference = [(labels.tolist(), images.sum().item()) for _ in range(2) for images, labels in whole]
    loader = loader_of()
    got = []
    for step, (images, labels) in enumerate(loader):
        got.append((labels.tolist(), images.sum().item()))
        if step == 5:
            state = loader.state_dict()
            break
    del loader  # "killed": a fresh loader resumes from the saved state
    resumed = loader_of()
    resumed.load_state_dict(state)
    got += [(labels.tolist(), images.sum().item()) for images, labels in resumed]
    got += [(labels.tolist(), images.sum().item()) for images, labels in resumed]  # the next epoch
    half = len(reference) // 2
    assert got == reference and reference[:half] != reference[half:]


def test_elastic_resume_two_ranks_to_one_covers_the_epoch_once(aspects):
    budget = TokenBudget(patch=PATCH, budget=72, seq_lens=(16, 36), group=2)
    options = dict(buckets=budget, seed=7, world_size=2)
    first: list[int] = []
    state = None
    for r in range(2):
        it = open_iterable(aspects, rank=r, **options)
        stream = iter(it)
        for _ in range(3):
            first += next(stream)[1].tolist()
        if r == 0:
            state = it.state_dict()
    one = open_iterable(aspects, buckets=budget, seed=7, rank=0, world_size=1)
    one.load_state_dict(state)
    rest = [x for images, labels in one for x in labels.tolist() if check_batch(images, labels, budget)]
    whole = open_iterable(aspects, buckets=budget, seed=7, rank=0, world_size=1)
    assert Counter(first + rest) == Counter(x for _, labels in whole for x in labels.tolist())
    # without a common group= the schedule differs: refused, naming it
    default = open_iterable(aspects, buckets=BUDGET, seed=7, rank=0, world_size=1)
    with pytest.raises(ResumeError, match="group"):
        default.load_state_dict(state)


def test_the_per_sample_path_is_refused_naming_the_fix(aspects):
    for options in ({"loader_batch_size": 4}, {"transform": lambda x: x}, {"target_transform": int}):
        with pytest.raises(OptionError, match="TokenBudget.*batch_transform="):
            open_iterable(aspects, buckets=BUDGET, **options)
    with pytest.raises(OptionError, match="drop batch_size="):
        open_iterable(aspects, buckets=BUDGET, batch_size=8)
    with pytest.raises(OptionError, match="leave make_loader's batch_size out"):
        make_loader(open_iterable(aspects, buckets=BUDGET), batch_size=4)


def test_token_budget_options_are_checked():
    with pytest.raises(OptionError, match="more patches than budget"):
        TokenBudget(budget=100, seq_lens=(64, 128))
    with pytest.raises(OptionError, match="seq_lens"):
        TokenBudget(seq_lens=())
    with pytest.raises(OptionError, match="patch"):
        TokenBudget(patch=0)
    with pytest.raises(OptionError, match="leftover"):
        TokenBudget(leftover="carry")
    assert TokenBudget(budget=4096, seq_lens=(256, 64, 256)).seq_lens == (64, 256)


def test_dali_fallback_gives_the_open_iterable_batches(aspects):
    from readers import dali_loader

    options = dict(buckets=BUDGET, seed=7, flip=True)
    loader = dali_loader(aspects, batch_size=BUDGET.slots, device="dataloader", num_workers=2, **options)
    got = [(images.clone(), labels.clone()) for images, labels in loader]
    want = list(make_loader(open_iterable(aspects, **options), num_workers=0))
    assert len(got) == len(want) and len({len(labels) for _, labels in got}) > 2
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)
    with pytest.raises(OptionError, match="device='dataloader'"):  # not DALI's own pipeline (yet)
        dali_loader(aspects, batch_size=BUDGET.slots, device="cpu", **options)


@pytest.fixture(scope="module")
def coco_lmdb(tmp_path_factory) -> Path:
    return pack_coco(tmp_path_factory)


def test_boxes_frame_the_drawn_rectangles_at_every_length(coco_lmdb):
    budget = TokenBudget(patch=16, budget=64, seq_lens=(16, 32), random_offset=True)
    it = open_iterable(coco_lmdb, buckets=budget, flip=True, seed=2, fields=FIELDS)
    compared = 0
    lengths = set()
    for images, target in make_loader(it, num_workers=2):
        h, w = images.shape[2:]
        assert len(images) * (h // 16) * (w // 16) <= 64
        lengths.add(len(images))
        for i in range(len(images)):
            sample = {name: target[name][i] for name in ("boxes", "categories", "iscrowd")}
            compared += check_frames(images[i], sample)
    assert {4, 2} <= lengths and compared >= 80  # both lengths (and smaller last batches)


def test_the_summary_counts_every_sample_and_the_padding_the_read_makes(aspects):
    from readers.bucketing.bucket_plan import sample_sizes
    from readers.formats import open_reader

    it = open_iterable(aspects, buckets=BUDGET, seed=7, world_size=2, rank=0)
    plan = token_summary(BUDGET, sample_sizes(open_reader(aspects)), world_size=2)
    assert sum(cell["samples"] for cell in plan["cells"]) == N
    assert plan["leftovers"] == it.order.leftovers
    assert {cell["seq_len"] for cell in plan["cells"]} == {16, 36}
    assert all(cell["batch"] == 72 // cell["seq_len"] for cell in plan["cells"])


def test_a_plain_dataloader_resumes_from_the_images_it_took(aspects):
    from torch.utils.data import DataLoader

    def labels_of(it):
        return [labels.tolist() for _, labels in DataLoader(it, batch_size=None, num_workers=2)]

    whole = labels_of(open_iterable(aspects, buckets=BUDGET, seed=7, world_size=2, rank=1))
    it = open_iterable(aspects, buckets=BUDGET, seed=7, world_size=2, rank=1)
    taken = []
    for _, labels in DataLoader(it, batch_size=None, num_workers=2):
        taken.append(labels.tolist())
        if len(taken) == 5:
            break
    images = sum(len(x) for x in taken)
    assert images != 5 * BUDGET.slots  # batches of both sizes: images are not slots
    state = it.state_dict(consumed=images)
    resumed = open_iterable(aspects, buckets=BUDGET, seed=7, world_size=2, rank=1)
    resumed.load_state_dict(state)
    assert taken + labels_of(resumed) == whole
    with pytest.raises(ResumeError, match="does not end a batch"):
        it.state_dict(consumed=images + 1)


TOKENS = ("--tokens", "8,72,16:36")  # tests/support/train_script.py's BUDGET


@pytest.mark.slow
def test_kill_and_resume_trains_on_the_uninterrupted_batches(aspects, tmp_path):
    """kill -9 mid-epoch, at an epoch's first batch and right after a resume (support/train_script.py)."""
    from tests.readers.order.test_resume import train

    (reference,) = train(aspects, tmp_path / "ref", *TOKENS)
    per_epoch = len(reference) // 2
    killed = ("--workers", "2", "--persistent")
    (resumed,) = train(aspects, tmp_path / "killed", *TOKENS, *killed, kill_at=(3, per_epoch, per_epoch + 1))
    assert resumed == reference
    assert set(BUDGET.batch_sizes) <= {len(step) - 1 for step in reference}  # [epoch, *sample ids]


@pytest.mark.slow
def test_two_gloo_ranks_take_equal_batches_at_every_step_and_resume_after_a_kill(aspects, tmp_path):
    from tests.readers.order.test_resume import train

    ranks = ("--world", "2", "--workers", "1")
    reference = train(aspects, tmp_path / "ref", *TOKENS, *ranks)
    assert len(reference) == 2 and len(reference[0]) == len(reference[1])
    assert all(len(a) == len(b) for a, b in zip(*reference))  # one batch size per step on both ranks
    per_epoch = len(reference[0]) // 2
    first = {x for rank in reference for step in rank[:per_epoch] for x in step[1:]}
    assert len(first) == N  # every sample in epoch 0 (a repeat, padding, is its cell's same pixels)
    resumed = train(aspects, tmp_path / "killed", *TOKENS, *ranks, kill_at=(4,))
    assert resumed == reference
