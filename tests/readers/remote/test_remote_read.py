"""Every format read from s3:// (a real moto server) equal to the local read, the part cache, and
``pack verify`` in parallel on local and remote datasets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from packer.info.verify import verify_dataset
from readers import open_dataset, open_iterable
from readers.errors import ChecksumError, ManifestError
from readers.formats import format_names, open_reader
from readers.store.checksums import file_sha256
from readers.store.manifest import read_manifest, write_manifest
from tests.conftest import run_cli
from tests.support.damage import flip_byte
from tests.support.s3server import BUCKET

FORMATS = format_names()
SPLIT = {"samples_per_shard": 16}  # 44 samples: 3 parts


def cached_suffix(reader) -> str:
    """The suffix the part cache gives a part's file: that of the file the manifest checksums."""
    return Path(reader.checksum_name(reader.manifest.shards[0])).suffix


def pack_small(packed, fmt: str) -> Path:
    return packed(fmt, options=SPLIT, resize=32, crop=32)


def upload(s3, local: Path, name: str) -> str:
    fs, _ = s3
    fs.put(str(local) + "/", f"{BUCKET}/{name}", recursive=True)
    return f"s3://{BUCKET}/{name}"


def all_records(reader) -> list[tuple]:
    records = reader.read_block(0, len(reader))
    return [(bytes(r.data), r.label, r.height, r.width, r.channels) for r in records]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_from_s3_equal_to_local(s3, packed, fmt, tmp_path):
    local = pack_small(packed, fmt)
    url = upload(s3, local, f"equal-{fmt}")
    options = s3[1]
    want = open_dataset(local, decode="bytes")
    ds = open_dataset(url, decode="bytes", storage_options=options, cache_dir=tmp_path)
    assert len(ds) == len(want) == 44 and ds.classes == want.classes
    assert all_records(ds.reader) == all_records(want.reader)
    assert [ds[i] for i in (0, 17, 43)] == [want[i] for i in (0, 17, 43)]
    kwargs = dict(shuffle=True, seed=3, decode="bytes")
    got = list(open_iterable(url, **kwargs, storage_options=options, cache_dir=tmp_path))
    assert got == list(open_iterable(local, **kwargs)) and len(got) == 44
    if fmt != "tar":  # tar reads ranges unless given a cache_dir; the others always download parts
        suffix = cached_suffix(ds.reader)
        shas = sorted(s.sha256 + suffix for s in ds.manifest.shards)
        assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == suffix) == shas
    assert not list(tmp_path.glob(".*.part")) and not list(tmp_path.glob("*.lock"))


def test_default_cache_dir_and_dataloader_workers_share_one_download(s3, packed, tmp_path, monkeypatch):
    local = pack_small(packed, "hdf5")
    url = upload(s3, local, "workers-hdf5")
    monkeypatch.setenv("IMGPACK_CACHE_DIR", str(tmp_path / "default"))
    kwargs = dict(shuffle=True, seed=1, batch_size=8, block_size=4, buffer_size=16)
    it = open_iterable(url, **kwargs, storage_options=s3[1])
    got = [(x.numpy(), y.numpy()) for x, y in DataLoader(it, batch_size=None, num_workers=2)]
    want = [(x.numpy(), y.numpy()) for x, y in DataLoader(open_iterable(local, **kwargs), batch_size=None)]
    assert len(got) == len(want) == 6
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(got, want))
    cached = sorted(p.name for p in (tmp_path / "default").glob("*.h5"))
    assert cached == sorted(s.sha256 + ".h5" for s in it.reader.manifest.shards)


# Formats that open each part on first use (BMP reads every index at open) and record its file size.
LAZY_PARTS = [fmt for fmt in FORMATS if fmt != "bmp"]


@pytest.mark.parametrize("fmt", LAZY_PARTS)
def test_corrupt_part_in_bucket_is_refused_and_a_bad_cached_copy_downloaded_again(s3, packed, fmt, tmp_path):
    fs, options = s3
    local = pack_small(packed, fmt)
    bad = tmp_path / "bad"
    shutil.copytree(local, bad)
    manifest = read_manifest(local)
    part = manifest.shards[1]
    data_name = open_reader(local).checksum_name(part)
    middle = (bad / data_name).stat().st_size // 2
    flip_byte(bad / data_name, middle)  # same size, different bytes
    url = upload(s3, bad, f"corrupt-{fmt}")
    cache = tmp_path / "cache"
    reader = open_reader(url, storage_options=options, cache_dir=cache)
    assert reader.read(0).label == open_reader(local).read(0).label  # part 0 is fine
    with pytest.raises(ChecksumError, match=f"{url}/{data_name}: sha256 does not match the manifest"):
        reader.read(20)
    assert not (cache / f"{part.sha256}{cached_suffix(reader)}").exists()  # never renamed into the cache
    fs.put(str(local / data_name), f"{BUCKET}/corrupt-{fmt}/{data_name}")  # the bucket repaired
    fresh = open_reader(url, storage_options=options, cache_dir=cache)
    assert all_records(fresh) == all_records(open_reader(local))
    # A copy changed in the cache: caught by verify=True and downloaded again.
    cached = cache / f"{part.sha256}{cached_suffix(reader)}"
    flip_byte(cached, middle)
    checked = open_reader(url, storage_options=options, cache_dir=cache, verify=True)
    assert all_records(checked) == all_records(open_reader(local))
    assert file_sha256(cached) == part.sha256
    # A truncated copy is replaced even without verify (its size is checked on every open).
    with open(cached, "r+b") as fh:
        fh.truncate(part.bytes - 10)
    assert all_records(open_reader(url, storage_options=options, cache_dir=cache)) == all_records(
        open_reader(local)
    )
    assert cached.stat().st_size == part.bytes


def test_cache_stays_under_its_size_limit(s3, packed, tmp_path):
    local = pack_small(packed, "lmdb")
    url = upload(s3, local, "evict-lmdb")
    shards = read_manifest(local).shards
    bound = max(s.bytes for s in shards) + 100
    reader = open_reader(url, storage_options=s3[1], cache_dir=tmp_path, cache_size=bound)
    assert all_records(reader) == all_records(open_reader(local))
    cached = list(tmp_path.glob("*.mdb"))
    assert len(cached) == 1 and cached[0].stat().st_size <= bound
    assert cached[0].name == f"{shards[-1].sha256}.mdb"  # the most recently used one is kept


def test_missing_part_or_dataset_is_a_clear_error(s3, packed, tmp_path):
    fs, options = s3
    local = pack_small(packed, "tfrecord")
    url = upload(s3, local, "missing-tfrecord")
    part = read_manifest(local).shards[2].file
    fs.rm(f"{BUCKET}/missing-tfrecord/{part}")
    reader = open_reader(url, storage_options=options, cache_dir=tmp_path)
    assert reader.read(0).label == open_reader(local).read(0).label
    with pytest.raises(ManifestError, match=f"{url}/{part}: listed in the manifest but not found"):
        reader.read(40)
    with pytest.raises(ManifestError, match=f"s3://{BUCKET}/nowhere/manifest.json: not found"):
        open_dataset(f"s3://{BUCKET}/nowhere", storage_options=options)


def corrupt_records_resealed(src: Path, out: Path) -> Path:
    """A copy of a tfrecord dataset with a flipped image byte in parts 0 and 2 whose manifest
    records the new checksums (so only reading the records can find the damage)."""
    shutil.copytree(src, out)
    manifest = read_manifest(out)
    for position in (0, 2):
        shard = manifest.shards[position]
        flip_byte(out / shard.file, shard.bytes // 2)
        shard.sha256 = file_sha256(out / shard.file)
    write_manifest(out, manifest)
    return out


def test_parallel_verify_reports_the_same_problems_as_one_worker(s3, packed, tmp_path):
    local = pack_small(packed, "tfrecord")
    bad = corrupt_records_resealed(local, tmp_path / "bad")
    one, two = (verify_dataset(bad, block=4, workers=n).problems for n in (1, 2))
    assert one == two and len(one) == 2 and all("fails its CRC32C" in p for p in one)
    assert verify_dataset(local, block=4, workers=2).ok
    url = upload(s3, bad, "verify-tfrecord")
    remote = [verify_dataset(url, block=4, workers=n, storage_options=s3[1]).problems for n in (1, 2)]
    assert remote[0] == remote[1] and len(remote[0]) == 2 and url in remote[0][0]
    assert verify_dataset(upload(s3, local, "verify-ok"), workers=2, storage_options=s3[1]).ok


def test_pack_verify_cli_workers_local_and_remote(s3, packed, tmp_path):
    fs, options = s3
    local = pack_small(packed, "lmdb")
    bad = tmp_path / "bad"
    shutil.copytree(local, bad)
    part = read_manifest(local).shards[1]
    flip_byte(bad / part.file / "data.mdb", part.bytes // 2)
    url = upload(s3, bad, "verify-cli-lmdb")
    reports = []
    for target in (str(bad), url):  # the CLI on 2 workers reports what one process finds
        proc = run_cli("verify", target, "--workers", "2", "--storage-options", json.dumps(options), "--json")
        assert proc.returncode == 1 and "endpoint_url" not in proc.stderr, proc.stderr
        reports.append(json.loads(proc.stdout))
        alone = verify_dataset(target, workers=1, storage_options=options)
        reports.append({**reports[-1], "problems": alone.problems})
    assert reports[0] == reports[1] and reports[2] == reports[3]
    assert len(reports[0]["problems"]) == 1 and "sha256" in reports[0]["problems"][0]
    assert reports[2]["problems"] == [
        f"{url}/{part.file}/data.mdb: sha256 does not match the manifest (corrupt or modified); "
        "re-upload it or re-pack the dataset"
    ]


def test_pack_info_reads_a_url_dataset(s3, packed):
    from click.testing import CliRunner

    from packer.cli import main

    local = pack_small(packed, "hdf5")
    url = upload(s3, local, "info-hdf5")
    result = CliRunner().invoke(main, ["info", url, "--storage-options", json.dumps(s3[1]), "--json"])
    assert result.exit_code == 0, result.output
    here = CliRunner().invoke(main, ["info", str(local), "--json"])
    remote_info, local_info = json.loads(result.output), json.loads(here.output)
    # The class mix needs every label: read locally, not downloaded for `pack info` of a URL.
    assert remote_info.pop("read_quality") is None and local_info.pop("read_quality")["batches"] >= 1
    assert remote_info == local_info
    text = CliRunner().invoke(main, ["info", url, "--storage-options", json.dumps(s3[1])]).output
    assert text.startswith(f"dataset   {url}\n") and "44 in 5 classes" in text


def test_unreachable_endpoint_and_bad_storage_options_never_echo_secrets():
    from click.testing import CliRunner

    from packer.cli import main
    from readers.remote.urls import RemoteError
    from tests.support.s3server import free_port

    options = {
        "key": "AKIDEXAMPLE",
        "secret": "not-a-real-secret",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},  # nothing listens
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
        "retries": 1,
    }
    with pytest.raises(RemoteError, match=f"s3://{BUCKET}/ds/manifest.json: reading failed") as caught:
        open_dataset(f"s3://{BUCKET}/ds", storage_options=options)
    assert "not-a-real-secret" not in str(caught.value) and "AKIDEXAMPLE" not in str(caught.value)
    result = CliRunner().invoke(main, ["verify", "s3://b/ds", "--storage-options", '{"secret": "hush"'])
    assert result.exit_code == 2 and "not valid JSON" in result.output and "hush" not in result.output


@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_remote_dataset_resumes_mid_epoch_through_the_cache_with_verify(s3, packed, tmp_path, mode):
    # remote x cache x verify x persistent workers x set_epoch x resume, on both read paths.
    from readers import make_loader

    url = upload(s3, pack_small(packed, "lmdb"), f"resume-{mode}")
    batch = {"batch_size": 4} if mode == "batch" else {}
    loader_batch = {} if mode == "batch" else {"batch_size": 4}

    def loader():
        it = open_iterable(url, seed=3, verify=True, storage_options=s3[1], cache_dir=tmp_path, **batch)
        return make_loader(it, num_workers=2, persistent_workers=True, **loader_batch)

    def labels(batches):
        return [y.tolist() for _, y in batches]

    first = loader()
    first.dataset.set_epoch(1)
    full = labels(first)
    taken = []
    first.set_epoch(1)  # again: a new pass would be the next epoch
    for _, y in first:  # epoch 1 again, stopped after 3 batches
        taken.append(y.tolist())
        if len(taken) == 3:
            break
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.dataset.set_epoch(1)
    assert taken == full[:3] and labels(resumed) == full[3:]
    every = open_dataset(url, storage_options=s3[1]).reader.labels()
    assert sorted(i for b in full for i in b) == sorted(every.tolist())
