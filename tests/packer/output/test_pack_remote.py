"""Packing from and to s3:// URLs against a real moto S3 server on 127.0.0.1 (and a real Ray cluster)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.engine.pack_run import pack_folder
from packer.sources.remote_source import scan_url
from packer.sources.source import scan_folder
from readers.errors import ImgpackError
from readers.formats import format_names, open_reader
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, cli_env, run_cli
from tests.support.s3server import BUCKET, free_port

SPEC = PreprocessSpec(resize=24)
FORMATS = format_names()


@pytest.fixture(scope="module")
def source(s3, tmp_path_factory):
    """sample_data plus what the scan must leave out, locally and uploaded: (local root, URL)."""
    fs, _ = s3
    root = tmp_path_factory.mktemp("src") / "tree"
    shutil.copytree(SAMPLE_DATA, root)
    first = sorted(p for p in root.iterdir() if p.is_dir())[0]
    (first / ".hidden.jpg").write_bytes(b"x")
    (first / "notes.txt").write_text("not an image")
    (first / ".cache").mkdir()
    (first / ".cache" / "thumb.jpg").write_bytes(b"x")
    (root / ".trash").mkdir()
    (root / ".trash" / "a.jpg").write_bytes(b"x")
    (root / "README.txt").write_text("beside the classes")
    (root / "zz_empty").mkdir()
    fs.put(str(root) + "/", f"{BUCKET}/src", recursive=True)
    fs.pipe_file(f"{BUCKET}/src/zz_empty/", b"")  # how a bucket holds an empty folder
    return root, f"s3://{BUCKET}/src"


@pytest.fixture(scope="module")
def local_packs(source, tmp_path_factory):
    """fmt -> the same tree packed from local disk to local disk (the reference)."""
    root, _ = source
    cache = {}

    def get(fmt, shards=3):
        if (fmt, shards) not in cache:
            cache[fmt, shards] = tmp_path_factory.mktemp(f"ref-{fmt}") / "ds"
            pack_folder(root, cache[fmt, shards], fmt, SPEC, workers=1, options={"shards": shards})
        return cache[fmt, shards]

    return get


def download(fs, url: str, dest):
    fs.get(url.removeprefix("s3://") + "/", str(dest) + "/", recursive=True)
    return dest


def assert_same_dataset(ours, reference):
    """Same records and the same manifest apart from where the source was and when."""
    a, b = asdict(read_manifest(ours)), asdict(read_manifest(reference))
    for manifest in (a, b):
        manifest.pop("created")
        manifest["extra"].pop("source")
    assert a == b
    got, want = open_reader(ours), open_reader(reference)
    n = len(want)
    assert len(got) == n > 0
    assert [(bytes(r.data), r.label) for r in got.read_block(0, n)] == [
        (bytes(r.data), r.label) for r in want.read_block(0, n)
    ]


def test_remote_scan_equals_the_local_scan(source, s3):
    root, url = source
    _, options = s3
    remote, local = scan_url(url, options), scan_folder(root)
    assert remote.classes == local.classes
    assert [(i.index, i.rel, i.label) for i in remote.items] == [
        (i.index, i.rel, i.label) for i in local.items
    ]
    assert (remote.ignored, remote.empty_classes) == (local.ignored, local.empty_classes) == (2, ["zz_empty"])
    assert remote.items[0].path == f"{url}/{remote.items[0].rel}"
    fs, _ = s3
    fs.pipe({f"{BUCKET}/packed/manifest.json": b"{}", f"{BUCKET}/packed/data-000000.lmdb/data.mdb": b"x"})
    with pytest.raises(ImgpackError, match="this is an imgpack dataset"):
        scan_url(f"s3://{BUCKET}/packed", options)


@pytest.mark.parametrize("fmt", FORMATS)
def test_s3_to_s3_equals_a_local_pack(fmt, source, s3, local_packs, tmp_path):
    fs, options = s3
    _, url = source
    out = f"s3://{BUCKET}/out-{fmt}"
    workers = 2 if fmt == "tar" else 1  # one format through the process pool is enough
    report = pack_folder(url, out, fmt, SPEC, workers=workers, options={"shards": 3}, storage_options=options)
    assert report.out == out and report.packed == 44
    names = [p.split("/", 2)[2] for p in fs.find(f"{BUCKET}/out-{fmt}")]
    assert "manifest.json" in names and ".imgpack-progress.json" not in names
    assert not any(n.startswith(("part-", ".staging")) for n in names)  # parts became shards
    assert_same_dataset(download(fs, out, tmp_path / "got"), local_packs(fmt))
    assert read_manifest(tmp_path / "got").extra["source"] == url


def bucket_progress(fs, prefix: str) -> dict | None:
    try:
        return json.loads(fs.cat_file(f"{BUCKET}/{prefix}/.imgpack-progress.json"))
    except (FileNotFoundError, ValueError):
        return None


def test_killed_mid_upload_resumes_and_reuploads_a_part_of_the_wrong_size(source, s3, local_packs, tmp_path):
    fs, options = s3
    _, url = source
    out = f"s3://{BUCKET}/killed"
    args = ["imagefolder", url, "--to", "tar", "-o", out, "--resize", "24", "--shards", "22",
            "--workers", "1",
            "--storage-options", json.dumps(options), "-q"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "packer.cli", *args], env=cli_env())
    deadline = time.monotonic() + 60
    progress = None
    while time.monotonic() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        progress = bucket_progress(fs, "killed")
        if progress and len(progress["parts"]) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the pack ended before it could be killed"
    fs.invalidate_cache()
    assert not fs.exists(f"{BUCKET}/killed/manifest.json")
    done = bucket_progress(fs, "killed")["parts"]
    assert len(done) >= 2
    # One part in the bucket loses bytes: its recorded size no longer matches, so it is redone.
    damaged = next(name for name in done[1]["extra"]["uploaded"] if name.endswith(".tar"))
    whole = fs.cat_file(f"{BUCKET}/killed/{damaged}")
    fs.pipe_file(f"{BUCKET}/killed/{damaged}", whole[:-512])
    assert run_cli(*args[:-1], "--resume", "--json").returncode == 0
    fs.invalidate_cache()
    assert_same_dataset(download(fs, out, tmp_path / "got"), local_packs("tar", shards=22))


def test_force_deletes_only_our_objects(source, s3):
    fs, options = s3
    _, url = source
    out = f"s3://{BUCKET}/forced"
    pack_folder(url, out, "lmdb", SPEC, workers=1, storage_options=options)
    with pytest.raises(ImgpackError, match="already exists; pass --force"):
        pack_folder(url, out, "lmdb", SPEC, workers=1, storage_options=options)
    fs.pipe_file(f"{BUCKET}/forced/notes.txt", b"someone else's")
    with pytest.raises(ImgpackError, match="notes.txt"):
        pack_folder(url, out, "lmdb", SPEC, workers=1, force=True, storage_options=options)
    fs.invalidate_cache()
    assert fs.exists(f"{BUCKET}/forced/manifest.json")  # nothing was deleted
    fs.rm(f"{BUCKET}/forced/notes.txt")
    report = pack_folder(
        url, out, "lmdb", PreprocessSpec(resize=16), workers=1, force=True, storage_options=options
    )
    assert report.packed == 44
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(f"{BUCKET}/forced/manifest.json"))["preprocess"]["resize"] == 16


def test_credentials_never_reach_the_error(tmp_path):
    secret = "wJalrXUtnFEMI-not-a-real-secret"
    endpoint = {"endpoint_url": f"http://127.0.0.1:{free_port()}"}
    options = {"key": "AKIAEXAMPLE", "secret": secret, "client_kwargs": endpoint, "retries": 1,
               "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}  # fmt: skip
    proc = run_cli("imagefolder", SAMPLE_DATA, "--to", "tar", "-o", f"s3://{BUCKET}/nowhere",
                   "--storage-options", json.dumps(options), timeout=120)  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in text, text
    assert f"s3://{BUCKET}/nowhere" in text and secret not in text and "AKIAEXAMPLE" not in text
    bad = CliRunner().invoke(main, ["imagefolder", str(SAMPLE_DATA), "--to", "tar", "-o", str(tmp_path / "x"),
                                    "--storage-options", "[1]"])  # fmt: skip
    assert bad.exit_code == 2 and "not a JSON object" in bad.output
    (tmp_path / "options.json").write_text("[1]")
    bad = CliRunner().invoke(main, ["imagefolder", str(SAMPLE_DATA), "--to", "tar", "-o", str(tmp_path / "x"),
                                    "--storage-options", f"@{tmp_path / 'options.json'}"])  # fmt: skip
    assert bad.exit_code == 2 and "options.json: not a JSON object" in bad.output


def test_a_second_pack_into_the_same_url_stops_at_once(s3):
    from packer.output.output_dir import OutputLock
    from packer.output.remote_output import staging_folder

    _, options = s3
    out = f"s3://{BUCKET}/locked"
    staging = staging_folder(out)
    staging.mkdir(parents=True, exist_ok=True)
    held = OutputLock(staging)  # what a running pack into ``out`` holds
    try:
        with pytest.raises(ImgpackError, match="another pack on this machine is writing"):
            pack_folder(SAMPLE_DATA, out, "tar", SPEC, workers=1, storage_options=options)
    finally:
        held.release()
    assert pack_folder(SAMPLE_DATA, out, "tar", SPEC, workers=1, storage_options=options).packed == 44
