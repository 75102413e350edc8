"""Remote datasets' local cache: a damaged cached index is fetched again (with a one-line warning), a
damaged remote index is blamed on the remote copy, a full cache disk is named as such."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from readers import open_dataset
from readers.errors import ManifestError
from readers.formats import format_names
from tests.support.damage import SMALL, SPLIT, upload_copy
from tests.support.disks import mounted_tmpfs
from tests.support.formats import formats_with_index_files, parts_hold_the_images

# -- a damaged cached index is fetched again; a full cache disk is named as such --------------


def _garbage(text: str) -> str:
    return "v1.2 x\nnot an index\n"


def _swapped(text: str) -> str:
    """Still a well-formed index, but of other byte ranges (only verify=True can tell)."""
    lines = text.splitlines()
    fields = lines[1].split()
    fields[2] = str(int(fields[2]) - 1)  # one byte shorter image member
    return "\n".join([lines[0], " ".join(fields), *lines[2:]]) + "\n"


@pytest.mark.parametrize(
    "fmt, damage, verify",
    [*((fmt, _garbage, False) for fmt in formats_with_index_files()), ("tar", _swapped, True)],
    ids=[*(f"{fmt}-garbage" for fmt in formats_with_index_files()), "tar-plausible-verify"],
)
def test_damaged_cached_index_is_fetched_again(s3, packed, tmp_path, fmt, damage, verify):
    fs, options = s3
    url = upload_copy(s3, packed, fmt, f"cached-idx-{fmt}-{verify}")
    cache = tmp_path / "cache"
    reference = [open_dataset(url, storage_options=options, cache_dir=cache)[i][1] for i in range(44)]
    idx = next(cache.glob("*.idx"))
    good = idx.read_text()
    idx.write_text(damage(good))
    with pytest.warns(UserWarning, match=re.escape(str(idx)) + ": cached index is damaged .* fetching s3://"):
        dataset = open_dataset(url, storage_options=options, cache_dir=cache, verify=verify)
        assert [dataset[i][1] for i in range(44)] == reference
    assert idx.read_text() == good  # the cache holds the remote copy again


def test_damaged_remote_index_is_blamed_on_the_remote_copy(s3, packed, tmp_path):
    fs, options = s3
    url = upload_copy(s3, packed, "tar", "bad-remote-idx")
    fs.pipe(f"{url.removeprefix('s3://')}/shard-000000.idx", b"v1.2 x\n")
    with pytest.raises(ManifestError, match=re.escape(f"{url}/shard-000000.idx") + ": not a v1.2"):
        read_all_remote(url, options, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.idx"))  # a bad copy is not cached


def read_all_remote(url: str, options: dict, cache: Path) -> None:
    dataset = open_dataset(url, storage_options=options, cache_dir=cache)
    for i in range(len(dataset)):
        dataset[i]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 16 KB tmpfs: smaller than one part of the test datasets."""
    with mounted_tmpfs(tmp_path / "tiny", "16k") as mount:
        yield mount


@pytest.mark.parametrize("fmt", format_names())
def test_full_cache_disk_is_named_not_blamed_on_the_server(s3, packed, tiny_disk, fmt):
    from readers.remote.urls import CacheError

    fs, options = s3
    url = upload_copy(s3, packed, fmt, f"full-cache-{fmt}")
    if not parts_hold_the_images(packed(fmt, options=SPLIT, **SMALL)):
        read_all_remote(url, options, tiny_disk)  # only small indexes are cached: they fit
        return
    with pytest.raises(
        CacheError, match=re.escape(str(tiny_disk)) + r".*the cache's disk is full.*free space"
    ):
        read_all_remote(url, options, tiny_disk)


# -- warnings print no line of imgpack's source ------------------------------------------------
def test_the_cached_index_refetch_warning_is_one_line(s3, packed, tmp_path):
    import subprocess
    import sys

    from tests.conftest import cli_env

    fs, options = s3
    fs.put(str(packed("tar")), "imgpack-test/warn-idx", recursive=True)
    url, cache = "s3://imgpack-test/warn-idx", tmp_path / "cache"
    script = (
        "import json, sys\nfrom readers import open_dataset\n"
        "ds = open_dataset(sys.argv[1], storage_options=json.loads(sys.argv[2]), cache_dir=sys.argv[3])\n"
        "print(ds[0][1])\n"
    )
    run = [sys.executable, "-c", script, url, json.dumps(options), str(cache)]
    subprocess.run(run, check=True, env=cli_env(), capture_output=True, timeout=120)
    idx = next(cache.glob("*.idx"))
    idx.write_text("v1.2 x\nnot an index\n")
    proc = subprocess.run(run, check=True, env=cli_env(), capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{idx}: cached index is damaged" in lines[0], proc.stderr
    assert "warn(" not in proc.stderr and ".py:" not in proc.stderr
