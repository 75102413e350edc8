"""A real two-process torch.distributed (gloo) group reading one dataset."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from readers import open_dataset, open_iterable

pytestmark = pytest.mark.slow  # a real two-rank gloo group

WORLD = 2


def _rank_main(rank: int, path: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        it = open_iterable(path, seed=11, decode="bytes")  # rank and world size come from the group
        loader = DataLoader(it, batch_size=None, num_workers=1)
        epochs = []
        for epoch in range(2):
            it.set_epoch(epoch)
            seen = [hashlib.sha1(image).hexdigest() for image, _ in loader]
            count = torch.tensor([len(seen)])
            dist.all_reduce(count, op=dist.ReduceOp.MAX)  # what DDP would hang on if counts differed
            epochs.append({"seen": seen, "max_count": int(count)})
        Path(out, f"rank{rank}.json").write_text(json.dumps({"len": len(it), "epochs": epochs}))
    finally:
        dist.destroy_process_group()


def test_two_rank_gloo_group_sees_each_sample_once_per_epoch(packed, tmp_path):
    path = packed("lmdb", resize=40, crop=32, encode="png")
    ds = open_dataset(path, decode="bytes")
    everything = sorted(hashlib.sha1(ds[i][0]).hexdigest() for i in range(len(ds)))
    assert len(ds) % WORLD == 0, "with an even split every sample is seen exactly once"
    os.environ.pop("RANK", None)
    mp.spawn(_rank_main, args=(str(path), str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert results[0]["len"] == results[1]["len"] == len(ds) // WORLD
    orders = []
    for epoch in range(2):
        per_rank = [r["epochs"][epoch]["seen"] for r in results]
        assert len(per_rank[0]) == len(per_rank[1]) == results[0]["epochs"][epoch]["max_count"]
        assert sorted(per_rank[0] + per_rank[1]) == everything
        orders.append(per_rank[0] + per_rank[1])
    assert orders[0] != orders[1]
