"""Views (readers/datasets/views.py, packer/edit/views.py): subsets of a dataset without copies, read
like datasets.

Every format from the registry: a view reads exactly its parent's samples at its indices
(pixels, labels, fields), in few parent reads, with no image bytes of its own; resume,
persistent workers, elastic, DDP, mix and dali_loader run over the view's own samples. The
checks (verify, re-packed parent, split, CLI, bucket) are in tests/packer/edit/test_views_checks.py.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from packer.edit.views import write_view
from packer.engine.pack_run import pack_folder
from readers import make_loader, mix, open_dataset, open_iterable, source_paths
from readers.datasets.views import ViewReader
from readers.errors import OptionError
from readers.formats import format_names, open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import formats_storing_fields
from readers.order.resume import ResumeError
from readers.store.manifest import read_manifest
from tests.support.views import FIXED, PICKED, spec_of, view_of


@pytest.fixture(params=format_names())
def parent(request, packed) -> tuple[str, Path]:
    fmt = request.param
    return fmt, packed(fmt, options={"shards": 3}, **spec_of(fmt))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- reading ------------------------------------------------------------------------------------
def test_a_view_reads_the_parents_samples_at_its_indices(parent, tmp_path):
    fmt, root = parent
    view = view_of(root, tmp_path / "view")
    reader, whole = open_reader(view), open_reader(root)
    assert isinstance(reader, ViewReader) and len(reader) == len(PICKED)
    for position, index in enumerate(PICKED):
        a, b = reader.read(position), whole.read(index)
        assert bytes(a.data) == bytes(b.data) and (a.label, a.shape) == (b.label, b.shape)
    assert reader.labels().tolist() == whole.labels()[PICKED].tolist()
    block = reader.read_block(3, 9)
    assert [bytes(r.data) for r in block] == [bytes(whole.read(i).data) for i in PICKED[3:9]]
    ds, full = open_dataset(view), open_dataset(root)
    for position in (0, 6, len(PICKED) - 1):
        image, label = ds[position]
        expected, expected_label = full[PICKED[position]]
        assert np.array_equal(np.asarray(image), np.asarray(expected)) and label == expected_label
    assert ds.classes == full.classes
    # No image bytes in the view: its manifest and 4 bytes an index.
    manifest = read_manifest(view)
    assert manifest.format == "view" and manifest.extra["view"]["parent_format"] == fmt
    assert dir_bytes(view) == (view / "manifest.json").stat().st_size + 4 * len(PICKED)
    assert dir_bytes(view) < 4096 < dir_bytes(root)
    assert str(view) in reader.describe(4) and whole.describe(PICKED[4]) in reader.describe(4)
    copy = pickle.loads(pickle.dumps(reader))  # as a spawned DataLoader worker gets it
    assert bytes(copy.read(5).data) == bytes(whole.read(PICKED[5]).data)
    with pytest.raises(OptionError, match="inside the dataset"):
        write_view(root, root / "val", PICKED)


def test_a_view_of_a_view_names_the_root_dataset(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    first = view_of(root, tmp_path / "first")
    second = view_of(first, tmp_path / "second", [1, 4, 5])
    info = read_manifest(second).extra["view"]
    assert os.path.normpath(tmp_path / "second" / info["parent"]) == os.path.normpath(root)
    reader = open_reader(second)
    assert reader.indices.tolist() == [PICKED[1], PICKED[4], PICKED[5]]
    assert source_paths(second) == [source_paths(root)[i] for i in (PICKED[1], PICKED[4], PICKED[5])]
    assert isinstance(reader.parent, type(open_reader(root)))


def test_consecutive_view_positions_are_read_as_few_parent_blocks(parent, tmp_path):
    from readers.formats import FormatReader

    _, root = parent
    view = view_of(root, tmp_path / "view", list(range(5, 37)))
    it = open_iterable(view, shuffle=False, batch_size=8)
    whole = it.reader.parent
    asked: list[list[int]] = []
    blocks: list[int] = []
    read_many, read_local = whole.read_many, whole.read_local

    def many(indices):
        asked.append(np.asarray(indices).tolist())
        return read_many(indices)

    def local(shard, start, stop):
        blocks.append(stop - start)
        return read_local(shard, start, stop)

    whole.read_many, whole.read_local = many, local
    got = [labels for _, labels in DataLoader(it, batch_size=None)]
    assert sum(len(labels) for labels in got) == 32
    # At most one call of the parent per batch, with whole runs of parent indices, ascending...
    assert len(asked) <= 4 and [i for call in asked for i in call] == list(range(5, 37))
    # ...read as one block per shard it spans, where the format reads by blocks.
    if (
        type(whole).read_local is not FormatReader.read_local
        and type(whole).read_many is FormatReader.read_many
    ):
        assert len(blocks) <= 4 + 2 and sum(blocks) == 32  # 4 batches, at most 2 shard cuts


def test_fields_ride_along(tmp_path):
    from packer.sources.imagelist import scan_list
    from tests.support.cocodata import draw_rectangles

    (tmp_path / "images").mkdir()
    images = draw_rectangles(tmp_path / "images", 12, 24, 32)
    lines = ["path,label,n,note"] + [f"{i:02d}.png,{i % 2},{i},note {i}" for i in range(12)]
    (images / "list.csv").write_text("\n".join(lines) + "\n")
    for fmt in formats_storing_fields():
        out = tmp_path / fmt
        spec = PreprocessSpec(encode="bmp") if fmt == "bmp" else PreprocessSpec(encode="png")
        pack_folder(scan_list(images / "list.csv", images), out, fmt, spec, workers=1)
        view = view_of(out, tmp_path / f"{fmt}-view", [1, 5, 6, 11])
        got = [open_dataset(view, fields=["n", "note"])[k][1] for k in range(4)]
        whole = open_dataset(out, fields=["n", "note"])
        assert got == [whole[i][1] for i in (1, 5, 6, 11)], fmt
        assert read_manifest(view).fields == read_manifest(out).fields


# -- order and resume ---------------------------------------------------------------------------
def batch_list(it, num_workers: int, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(it, batch_size=None, num_workers=num_workers, **options)
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_resume_mid_epoch_with_workers_is_exact_and_refused_on_another_view(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(0, 44, 2)) + [43])
    it = open_iterable(view, seed=4, batch_size=4, crop=24)
    it.set_epoch(2)
    full = batch_list(it, 2)
    it.set_epoch(2)
    taken = []
    for batch in DataLoader(it, batch_size=None, num_workers=2):
        taken.append(batch)
        if len(taken) == 3:
            break
    state = it.state_dict(consumed=12)
    resumed = open_iterable(view, seed=4, batch_size=4, crop=24)
    resumed.load_state_dict(state)
    rest = batch_list(resumed, 2)
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(full[3:], rest))
    # Persistent workers go on to full epochs after the resumed one.
    it.set_epoch(3)
    epoch3 = batch_list(it, 0)
    again = open_iterable(view, seed=4, batch_size=4, crop=24)
    again.load_state_dict(state)
    loader = make_loader(again, num_workers=2, persistent_workers=True)
    again.set_epoch(2)
    first = [(x.clone(), y.clone()) for x, y in loader]
    again.set_epoch(3)
    second = [(x.clone(), y.clone()) for x, y in loader]
    assert [y.tolist() for _, y in first] == [y.tolist() for _, y in full[3:]]
    assert [y.tolist() for _, y in second] == [y.tolist() for _, y in epoch3]
    # A view of the same size with other samples is another dataset: its states do not apply.
    other = view_of(root, tmp_path / "other", list(range(1, 44, 2)) + [42])
    assert len(open_reader(other)) == len(open_reader(view))
    with pytest.raises(ResumeError, match="dataset"):
        open_iterable(other, seed=4, batch_size=4, crop=24).load_state_dict(state)
    # The order over a view depends on the view's samples only: the same for a copy of it.
    assert read_manifest(other).num_samples == read_manifest(view).num_samples


def test_elastic_resume_from_two_ranks_to_one_reads_each_view_sample_once(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(3, 35)))  # 32 samples
    ids = {bytes(open_reader(view).read(k).data): k for k in range(32)}
    seen, states = [], []
    for rank in (0, 1):
        it = open_iterable(view, seed=9, rank=rank, world_size=2, decode="bytes")
        taken = 0
        for image, _ in it:
            seen.append(ids[bytes(image)])
            taken += 1
            if taken == 8:
                break
        states.append(it.state_dict())
    assert states[0]["position"] == states[1]["position"]
    single = open_iterable(view, seed=9, decode="bytes")
    single.load_state_dict(states[0])
    seen += [ids[bytes(image)] for image, _ in single]
    assert sorted(seen) == list(range(32))


def _rank_main(rank: int, path: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        it = open_iterable(path, seed=11, decode="bytes")
        seen = [bytes(image).hex() for image, _ in DataLoader(it, batch_size=None, num_workers=1)]
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


def test_two_ddp_ranks_read_each_view_sample_once(packed, tmp_path):
    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view", list(range(1, 41, 2)))  # 20 samples
    os.environ.pop("RANK", None)
    mp.spawn(_rank_main, args=(str(view), str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    reader = open_reader(view)
    assert len(ranks[0]) == len(ranks[1]) == 10
    assert sorted(ranks[0] + ranks[1]) == sorted(bytes(reader.read(k).data).hex() for k in range(20))


def test_mix_and_dali_loader_read_a_view(packed, tmp_path):
    from readers.dali import dali_loader

    root = packed("lmdb", options={"shards": 3}, **FIXED)
    view = view_of(root, tmp_path / "view")
    labels = sorted(open_reader(view).labels().tolist())
    ds = open_dataset(view, decode="numpy")
    pixels = {np.ascontiguousarray(ds[k][0]).tobytes(): ds[k][1] for k in range(len(ds))}
    from_view = 0
    for images, ys in mix([view, root], batch_size=4, seed=2):
        for image, y in zip(images, ys.tolist()):
            if y < 5:  # dataset 0 of the mix: a sample of the view (the parent's labels are offset)
                assert pixels[image.permute(1, 2, 0).contiguous().numpy().tobytes()] == y
                from_view += 1
    assert from_view > 0
    for device in ("dataloader", "cpu"):
        loader = dali_loader(view, batch_size=len(PICKED), device=device, num_workers=1, device_id=None)
        got = [y.cpu() for _, y in loader]
        assert sorted(torch.cat(got).tolist()) == labels, device
