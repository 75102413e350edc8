"""packer/bench/suites/fastpath.py: the order runs take in each round, and the full-size workloads' data."""

from __future__ import annotations

import numpy as np
from PIL import Image

from packer.bench.bench_data import make_bench_folder
from packer.bench.suites.fastpath import PEERS, prepare, round_plan
from readers.formats import open_reader


def test_every_other_round_runs_in_reverse_order():
    workloads = ["W_train", "W_jpeg", "W_train_full"]
    contenders = ["imgpack-batch", "imgpack-sample", "webdataset", "imagefolder", "ffcv"]
    first, second, third = (round_plan(workloads, contenders, r) for r in range(3))
    expected = [(w, c) for w in workloads for c in contenders if c in PEERS[w]]
    assert first == expected == third
    assert second == expected[::-1]
    assert first[0] == ("W_train", "imgpack-batch") and second[0] == ("W_train_full", "ffcv")


def test_full_size_workloads_store_the_source_size(tmp_path):
    src = make_bench_folder(tmp_path / "src", n=6, classes=2, seed=0, size=(160, 120))
    paths = prepare(src, tmp_path / "out", None, ["W_train_full", "W_jpeg_full"])
    assert paths["W_train_full"] == paths["W_jpeg_full"]  # one stored copy, two reads of it
    assert "W_jpeg" not in paths and "wds" not in paths["W_jpeg_full"]  # nothing the run does not read
    reader = open_reader(paths["W_jpeg_full"]["lmdb"])
    stored = sorted((reader.read(i).height, reader.read(i).width) for i in range(len(reader)))
    source = sorted(Image.open(p).size[::-1] for p in src.rglob("*.jpg"))
    assert len(stored) == 6 and stored == source
    assert min(np.ptp(stored, axis=0)) > 0  # sizes vary: none was resized to a common size
    assert reader.read(0).encoding == "jpeg"
