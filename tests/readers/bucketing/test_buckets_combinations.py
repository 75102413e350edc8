"""Bucketed reads (buckets=) in the combinations users run: resume x persistent workers x both
read paths x another worker count, fields (labels, JSON, boxes, COCO masks) x random offset x
flip, remote (s3:// on moto, also into DALI's pipeline), DALI's pipeline x elastic resume, an
appended dataset, views and splits, a real gloo group x persistent workers x resume.

The sets are small (tens of images a few dozen pixels a side): every test reads real packs
through real DataLoader workers; the bucketed set is test_buckets.py's (a label names its
sample, images at 16:9, 9:16, 4:3, 3:4 and 1:1)."""

from __future__ import annotations

import hashlib
import itertools
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
from packer.edit.append import append_to
from packer.edit.views import split_views, write_view
from packer.scan.rows import Row, pack_rows
from packer.sources.source import scan_folder
from readers import AspectBuckets, ResumeError, make_loader, open_dataset, open_iterable
from tests.readers.bucketing import test_buckets
from tests.readers.bucketing.test_buckets import BATCH, BUCKETS, SHAPES, expected_bucket, write_aspect_images
from tests.readers.fields import test_masks
from tests.readers.fields.test_fields import iou, rectangle_in
from tests.readers.remote.test_remote_read import upload
from tests.support.cocodata import coco_pack_args

aspects = test_buckets.aspects  # 48 images, label = index, LMDB
N = sum(SHAPES.values())
OFFSET = AspectBuckets(area=32 * 32, multiple=8, random_offset=True)


def fingerprint(images: torch.Tensor) -> str:
    return hashlib.sha1(images.contiguous().numpy().tobytes()).hexdigest()[:12]


def steps_of(batches) -> list[tuple]:
    """(shape, labels, pixel fingerprint) of each batch, checking each is one bucket."""
    out = []
    for images, labels in batches:
        shape = tuple(images.shape[2:])
        assert all(expected_bucket(int(x)) == shape for x in labels)
        out.append((shape, labels.tolist(), fingerprint(images)))
    return out


# -- resume x persistent workers x both read paths, across two epochs ---------------------------
@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_persistent_workers_resume_mid_epoch_in_both_epochs_exactly(aspects, mode):
    def loader_of(workers: int = 2):
        batch = {"batch_size": BATCH} if mode == "batch" else {}
        it = open_iterable(aspects, buckets=OFFSET, flip=True, seed=7, **batch)
        loader_batch = {} if mode == "batch" else {"batch_size": BATCH}
        return make_loader(it, num_workers=workers, persistent_workers=True, **loader_batch)

    whole = loader_of()
    reference = [steps_of(whole) for _ in range(2)]  # epochs 0 and 1, each pass the next epoch
    assert reference[0] != reference[1] and len(reference[0]) == len(reference[1])
    assert {x for _, labels, _ in reference[0] for x in labels} == set(range(N))
    got: list[tuple] = []
    loader = loader_of()
    got += steps_of(itertools.islice(loader, 5))  # epoch 0: killed after 5 batches
    state = loader.state_dict()
    del loader
    loader = loader_of()
    loader.load_state_dict(state)
    got += steps_of(loader)  # the rest of epoch 0
    got += steps_of(itertools.islice(loader, 3))  # epoch 1 with the same (persistent) workers
    state = loader.state_dict()
    del loader
    loader = loader_of(workers=1)  # another worker count resumes the same batches
    loader.load_state_dict(state)
    got += steps_of(loader)
    assert got == reference[0] + reference[1]


# -- fields x random offset x flip ----------------------------------------------------------------
FIELD_SHAPES = [(60, 100), (100, 60), (72, 96), (96, 72), (80, 80)]
FIELD_COUNT = 20
FIELD_BUCKETS = AspectBuckets(area=48 * 48, multiple=8, random_offset=True)


def marked_rect(i: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """Image i's stored size and its rectangle (x, y, w, h): in the left third, so a flip that
    moved the pixels and not the box (or the box and not the pixels) cannot pass for framing."""
    h, w = FIELD_SHAPES[i % len(FIELD_SHAPES)]
    return (h, w), (w // 10 + i % 4, h // 4 + i % 3, w // 3 - i % 3, h // 2 - i % 4)


def marker(i: int) -> int:
    """The green value of image i's rectangle: the pixels name their sample."""
    return 20 + 10 * i


@pytest.fixture(scope="module")
def fielded(tmp_path_factory) -> Path:
    """Images at five aspect ratios, each a black canvas with one rectangle (red 255, green naming
    the sample), packed losslessly with its box, a JSON field and its own class."""
    src = tmp_path_factory.mktemp("fielded-src")
    rows = []
    for i in range(FIELD_COUNT):
        (h, w), (x, y, bw, bh) = marked_rect(i)
        pixels = np.zeros((h, w, 3), np.uint8)
        pixels[y : y + bh, x : x + bw] = (255, marker(i), 0)
        Image.fromarray(pixels).save(src / f"{i:02d}.png")
        meta = {"index": i, "name": f"s{i}", "tags": [i % 3, "é"]}
        rows.append(Row(f"{i:02d}.png", i, {"boxes": [[x, y, bw, bh]], "meta": meta}))
    out = tmp_path_factory.mktemp("fielded") / "ds"
    classes = [f"s{i:02d}" for i in range(FIELD_COUNT)]
    pack_rows(rows, src, classes, out, "lmdb", {"boxes": "boxes", "meta": "json"}, workers=1, order="source")
    return out


def check_sample(image: np.ndarray, label: int, meta: dict, boxes: np.ndarray, geometry: dict) -> None:
    """The pixels' sample is the label's and the JSON field's; its box frames its rectangle, on
    the side the flip says."""
    named = int(np.median(image[..., 1][image[..., 0] > 200]))
    assert abs(named - marker(label)) <= 2, (named, label)  # markers 10 apart; the resampler rounds
    assert meta == {"index": label, "name": f"s{label}", "tags": [label % 3, "é"]}
    assert boxes.shape == (1, 4) and tuple(image.shape[:2]) == tuple(geometry["out"])
    found = rectangle_in(image)
    assert iou(found, boxes[0].tolist()) >= 0.9, (found, boxes)
    assert (found[0] + found[2] / 2 > image.shape[1] / 2) == geometry["flip"]


@pytest.mark.parametrize("batched", [True, False])
def test_fields_follow_their_sample_through_random_offset_and_flip(fielded, batched):
    fields = ["boxes", "meta", "geometry"]
    options = dict(buckets=FIELD_BUCKETS, flip=0.5, seed=4, layout="HWC", fields=fields)
    checked, flipped, shapes, windows = 0, 0, set(), set()
    for epoch in range(2):
        if batched:
            it = open_iterable(fielded, batch_size=4, **options)
            it.set_epoch(epoch)
            samples = (
                (images[k], target["label"][k], target["meta"][k], target["boxes"][k], target["geometry"][k])
                for images, target in make_loader(it, num_workers=2)
                for k in range(len(images))
            )
        else:
            it = open_iterable(fielded, decode="numpy", **options)
            it.set_epoch(epoch)
            samples = ((im, t["label"], t["meta"], t["boxes"], t["geometry"]) for im, t in it)
        for image, label, meta, boxes, geometry in samples:
            check_sample(np.asarray(image), int(label), meta, np.asarray(boxes), geometry)
            checked += 1
            flipped += bool(geometry["flip"])
            shapes.add(tuple(geometry["out"]))
            windows.add((int(label), tuple(geometry["window"])))
    assert checked >= 2 * FIELD_COUNT and 0 < flipped < checked and len(shapes) >= 3
    assert len(windows) > FIELD_COUNT  # the random offset moved windows between the epochs


# -- remote ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aspects_tar(tmp_path_factory) -> Path:
    src = write_aspect_images(tmp_path_factory.mktemp("aspects-src"))
    out = tmp_path_factory.mktemp("aspects-tar") / "ds"
    args = ["imagefolder", str(src), "--to", "tar", "-o", str(out), "--samples-per-shard", "16", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    "fmt, cache", [("lmdb", "given"), ("lmdb", "default"), ("tar", "none")],
    ids=["lmdb-cache_dir", "lmdb-default-cache", "tar-ranges"],
)  # fmt: skip
def test_remote_bucketed_read_gives_the_local_batches(
    s3, aspects, aspects_tar, tmp_path, monkeypatch, fmt, cache
):
    local = aspects if fmt == "lmdb" else aspects_tar
    url = upload(s3, local, f"buckets-{fmt}-{cache}")
    monkeypatch.setenv("IMGPACK_CACHE_DIR", str(tmp_path / "default"))
    remote = {"storage_options": s3[1], **({"cache_dir": tmp_path / "given"} if cache == "given" else {})}
    options = dict(batch_size=BATCH, buckets=OFFSET, flip=True, seed=7)
    for epoch in (0, 1):
        want_it, got_it = open_iterable(local, **options), open_iterable(url, **options, **remote)
        want_it.set_epoch(epoch)
        got_it.set_epoch(epoch)
        want = steps_of(make_loader(want_it, num_workers=0))
        assert steps_of(make_loader(got_it, num_workers=2)) == want
        assert {x for _, labels, _ in want for x in labels} == set(range(N))
    if fmt == "lmdb":  # DALI's own pipeline from the URL: the same samples and shapes (pixels: DALI's resize)
        from readers.dali import dali_loader

        dali = dali_loader(url, device="cpu", py_workers=2, **options, **remote)
        dali.set_epoch(1)
        assert [(s, y) for s, y, _ in steps_of(dali)] == [(s, y) for s, y, _ in want]
    for where in ("given", "default"):  # the parts went where the options say, and only there
        assert any((tmp_path / where).glob("*")) == (cache == where)


# -- DALI's own pipeline x elastic resume -------------------------------------------------------
def test_dali_pipeline_elastic_resume_two_ranks_to_one_covers_the_epoch_once(aspects):
    from readers.dali import dali_loader

    buckets = AspectBuckets(area=32 * 32, multiple=8, group=2, random_offset=True)
    options = dict(batch_size=BATCH, buckets=buckets, seed=7, flip=True)
    first: list[int] = []
    states = []
    for rank in range(2):
        loader = dali_loader(aspects, device="cpu", rank=rank, world_size=2, **options)
        loader.set_epoch(1)
        first += [x for _, labels, _ in steps_of(itertools.islice(loader, 3)) for x in labels]
        states.append(loader.state_dict())
    # one position for every rank: any rank's state resumes them all
    assert {**states[0], "rank": 1} == states[1]
    one = dali_loader(aspects, device="cpu", world_size=1, **options)
    one.load_state_dict(states[0])
    rest = [x for _, labels, _ in steps_of(one) for x in labels]
    whole = open_iterable(aspects, **options)
    whole.set_epoch(1)
    everything = [x for _, labels in whole for x in labels.tolist()]
    assert Counter(first + rest) == Counter(everything) and set(everything) == set(range(N))


# -- an appended dataset ----------------------------------------------------------------------------
NEW_SHAPES = {(32, 96): 5, (96, 32): 3}  # ratios 3 and 1/3: buckets the old samples never used


def expected_of(size: tuple[int, int]) -> tuple[int, int]:
    return BUCKETS.sizes[int(BUCKETS.assign(np.asarray([size[0]]), np.asarray([size[1]]))[0])]


def test_appended_samples_get_buckets_from_their_sizes_and_an_old_state_is_refused(tmp_path):
    (tmp_path / "old").mkdir()
    old = write_aspect_images(tmp_path / "old")
    new = tmp_path / "new"
    sizes = [s for s, n in NEW_SHAPES.items() for _ in range(n)]
    for i, (h, w) in enumerate(sizes):
        (new / f"n{i:02d}").mkdir(parents=True)
        Image.new("RGB", (w, h), (i * 20, 0, 0)).save(new / f"n{i:02d}" / "img.png")
    ds = tmp_path / "ds"
    result = CliRunner().invoke(main, ["imagefolder", str(old), "--to", "lmdb", "-o", str(ds), "-q"])
    assert result.exit_code == 0, result.output
    it = open_iterable(ds, batch_size=BATCH, buckets=BUCKETS, seed=7)
    next(iter(it))
    state = it.state_dict()
    append_to(ds, scan_folder(new), workers=1)

    grown = open_iterable(ds, batch_size=BATCH, buckets=BUCKETS, seed=7)
    stored = {f"c{i:03d}": test_buckets.stored_size_of(i) for i in range(N)}
    stored.update({f"n{i:02d}": size for i, size in enumerate(sizes)})
    seen = Counter()
    for images, labels in grown:
        assert {expected_of(stored[grown.classes[x]]) for x in labels.tolist()} == {tuple(images.shape[2:])}
        seen.update(grown.classes[x] for x in labels.tolist())
    assert set(seen) == set(stored)
    new_buckets = {expected_of(size) for size in NEW_SHAPES}
    assert len(new_buckets) == 2 and not new_buckets & {expected_bucket(i) for i in range(N)}
    with pytest.raises(ResumeError, match="saved on version 1 of the dataset but .* is version 2"):
        grown.load_state_dict(state)


# -- views and splits -----------------------------------------------------------------------------
PICKED = [0, 2, 3, 5, 8, 13, 14, 15, 16, 20, 21, 24, 30, 31, 33, 38, 40, 41, 44, 47]


def test_a_view_and_a_split_read_bucketed_batches_of_their_own_samples(aspects, tmp_path):
    write_view(aspects, tmp_path / "view", PICKED)
    split_views(aspects, tmp_path / "split", val=0.25, seed=0)
    sides = {"view": tmp_path / "view", **{s: tmp_path / "split" / s for s in ("train", "val")}}
    held = {}
    for name, path in sides.items():
        it = open_iterable(path, batch_size=BATCH, buckets=BUCKETS, seed=7, world_size=2, rank=0)
        other = open_iterable(path, batch_size=BATCH, buckets=BUCKETS, seed=7, world_size=2, rank=1)
        ranks = [steps_of(make_loader(x, num_workers=2)) for x in (it, other)]
        assert [s for s, _, _ in ranks[0]] == [s for s, _, _ in ranks[1]]  # one bucket per step
        held[name] = {x for steps in ranks for _, labels, _ in steps for x in labels}
        assert len(held[name]) == len(it.reader)
    labels = open_dataset(aspects).reader.labels()  # packs shuffle: index i holds label labels[i]
    assert held["view"] == set(labels[PICKED].tolist())
    assert held["train"] | held["val"] == set(range(N)) and not held["train"] & held["val"]
    # a state of the view is not one of its parent
    it = open_iterable(sides["view"], batch_size=BATCH, buckets=BUCKETS, seed=7)
    next(iter(it))
    with pytest.raises(ResumeError):
        open_iterable(aspects, batch_size=BATCH, buckets=BUCKETS, seed=7).load_state_dict(it.state_dict())


# -- DDP (a real gloo group) x persistent workers x the per-sample path x resume ------------------
WORLD = 2


def _gloo_rank(rank: int, path: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:

        def loader_of():
            it = open_iterable(path, buckets=OFFSET, flip=True, seed=5)  # rank and world from the group
            return make_loader(it, batch_size=BATCH, num_workers=1, persistent_workers=True)

        reference = steps_of(loader_of())
        loader = loader_of()
        got = steps_of(itertools.islice(loader, 3))
        state = loader.state_dict()
        del loader
        resumed = loader_of()
        resumed.load_state_dict(state)
        got += steps_of(resumed)
        Path(out, f"rank{rank}.json").write_text(json.dumps({"reference": reference, "resumed": got}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks, each starting three loaders' workers
def test_a_gloo_group_resumes_the_per_sample_path_with_persistent_workers_exactly(aspects, tmp_path):
    os.environ.pop("RANK", None)
    mp.spawn(_gloo_rank, args=(str(aspects), str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for record in ranks:
        assert record["resumed"] == record["reference"]
    steps = [record["reference"] for record in ranks]
    assert [shape for shape, _, _ in steps[0]] == [shape for shape, _, _ in steps[1]]  # one bucket a step
    assert {x for rank in steps for _, labels, _ in rank for x in labels} == set(range(N))


# -- masks (target="torchvision", masks=True) x random offset x flip --------------------------------
shapes = test_masks.shapes  # COCO images with a triangle (polygon) and an ellipse (RLE) each


@pytest.fixture(scope="module")
def shapes_lmdb(shapes, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shapes-lmdb") / "ds"
    result = CliRunner().invoke(main, [*coco_pack_args(shapes, "lmdb", out), "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    return out


def test_masks_cover_their_shapes_after_bucketing(shapes_lmdb):
    read = dict(buckets=AspectBuckets(area=56 * 56, multiple=8, random_offset=True), flip=True, seed=2,
                target="torchvision", masks=True)  # fmt: skip
    compared, seen = 0, set()
    for image, target in open_iterable(shapes_lmdb, **read):
        compared += test_masks.check_masks(image, target)
    for images, targets in open_iterable(shapes_lmdb, batch_size=4, **read):
        sizes = {np.asarray(t["masks"]).shape[-2:] for t in targets} | {tuple(i.shape[-2:]) for i in images}
        assert len(sizes) == 1  # one bucket a batch, the masks at its size
        seen |= sizes
        compared += sum(test_masks.check_masks(image, t) for image, t in zip(images, targets))
    assert compared >= 50 and len(seen) >= 2
