"""`--engine ray`: one task per part on a real local Ray cluster, same output as the local engine."""

from __future__ import annotations

import filecmp
import socket

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from readers import open_dataset, read_manifest
from readers.formats.packed_sample import PreprocessSpec
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.badinput import make_bad_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_cluster():
    """One real local Ray cluster for the module (starting one costs seconds)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_engine_writes_the_same_dataset_as_the_local_engine(ray_cluster, tmp_path):
    spec = PreprocessSpec(resize=48, encode="png")
    options = {"shards": 3}
    bad = tmp_path / "bad"
    bad.mkdir()
    make_bad_corpus(bad)
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


def test_ray_tasks_move_coco_boxes_with_the_pixels_like_the_local_engine(ray_cluster, tmp_path):
    """Boxes are refitted in the task that resizes the image (packer/engine/parts.py), once."""
    from packer.sources.coco import coco_source
    from tests.support.cocodata import make_coco

    coco = make_coco(tmp_path / "coco", count=24, empty=2)
    scan = coco_source(coco, coco.parent / "images")
    spec = PreprocessSpec(resize=48, crop=40)
    local = pack_folder(scan, tmp_path / "coco-local", "lmdb", spec, workers=2, options={"shards": 2})
    remote = pack_folder(scan, tmp_path / "coco-ray", "lmdb", spec, engine="ray", options={"shards": 2})
    assert remote.packed == local.packed == 24
    for shard in read_manifest(tmp_path / "coco-local").shards:
        assert filecmp.cmp(tmp_path / "coco-local" / shard.file / "data.mdb",
                           tmp_path / "coco-ray" / shard.file / "data.mdb", shallow=False)  # fmt: skip
    ds = open_dataset(tmp_path / "coco-ray", fields=["boxes"])
    boxes = np.concatenate([ds[i][1]["boxes"] for i in range(len(ds))])
    assert len(boxes) > 24 and (boxes[:, :2] + boxes[:, 2:] <= 40 + 1e-4).all()  # in the 40x40 stored pixels
    assert (boxes[:, :2] + boxes[:, 2:]).max() > 30  # moved, not squeezed twice


def test_ray_tasks_read_from_and_upload_to_s3(ray_cluster, s3, tmp_path, monkeypatch):
    """No shared filesystem: each task reads its images from the bucket and uploads its part."""
    from packer.sources import remote_source
    from tests.packer.output.test_pack_remote import SPEC, assert_same_dataset, download
    from tests.support.s3server import BUCKET

    fs, options = s3
    storage = {**options, "key": "testing", "secret": "testing"}  # the cluster started without them
    fs.put(str(SAMPLE_DATA) + "/", f"{BUCKET}/ray-src", recursive=True)

    def driver_must_not_read(*args, **kwargs):
        raise AssertionError("the driver read image bytes")

    monkeypatch.setattr(remote_source, "read_objects", driver_must_not_read)  # tasks are other processes
    out = f"s3://{BUCKET}/ray-out"
    report = pack_folder(f"s3://{BUCKET}/ray-src", out, "tar", SPEC, engine="ray", options={"shards": 3},
                         storage_options=storage)  # fmt: skip
    assert report.engine == "ray" and report.packed == 44
    reference = pack_folder(SAMPLE_DATA, tmp_path / "local", "tar", SPEC, workers=1, options={"shards": 3})
    assert_same_dataset(download(fs, out, tmp_path / "got"), reference.out)


def test_a_bad_ray_address_is_one_line_and_a_real_one_packs(ray_cluster, tmp_path):
    import ray

    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    out = tmp_path / "out"
    for address, reason in (
        ("bogus:1", "no Ray cluster answers there"),
        (f"127.0.0.1:{closed}", "no Ray cluster answers there (Connection refused)"),
        ("bogus", "not a host:port address"),
    ):
        proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--engine", "ray",
                       "--ray-address", address, "-q", timeout=60)  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert f"--ray-address {address}: {reason}" in lines[0] and "ray start --head" in lines[0]
        assert not out.exists()  # refused before the output is touched
    head = ray.get_runtime_context().gcs_address  # this test's real cluster: a second driver joins it
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", out, "--engine", "ray",
                   "--ray-address", head, "--resize", "32", "-q")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 44
