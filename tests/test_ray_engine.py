"""`--engine ray`: one task per part on a real local Ray cluster, same output as the local engine."""

from __future__ import annotations

import filecmp

from packer.engine import pack_folder
from packer.preprocess import PreprocessSpec
from readers import read_manifest
from tests.badinput import make_bad_corpus
from tests.conftest import SAMPLE_DATA


def test_ray_engine_writes_the_same_dataset_as_the_local_engine(tmp_path):
    import ray

    spec = PreprocessSpec(resize=48, encode="png")
    options = {"shards": 3}
    bad = tmp_path / "bad"
    bad.mkdir()
    make_bad_corpus(bad)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for name, src in (("sample", SAMPLE_DATA), ("bad", bad)):
            local = pack_folder(src, tmp_path / f"{name}-local", "lmdb", spec, workers=2, options=options)
            remote = pack_folder(src, tmp_path / f"{name}-ray", "lmdb", spec, engine="ray", options=options)
            assert remote.engine == "ray"
            assert (remote.packed, remote.skipped) == (local.packed, local.skipped)
            a, b = read_manifest(tmp_path / f"{name}-local"), read_manifest(tmp_path / f"{name}-ray")
            assert a.shards == b.shards and a.skipped == b.skipped and len(a.shards) == 3
            for shard in a.shards:
                assert filecmp.cmp(
                    tmp_path / f"{name}-local" / shard.file / "data.mdb",
                    tmp_path / f"{name}-ray" / shard.file / "data.mdb",
                    shallow=False,
                )
    finally:
        ray.shutdown()
