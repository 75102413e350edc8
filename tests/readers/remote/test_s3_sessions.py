"""S3 filesystems across the fork of DataLoader workers: the parent's connections survive its
workers (whatever was imported first), and a worker's new session reuses the parent's parsed
service models."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import REPO, cli_env
from tests.support.s3server import BUCKET

# A fresh interpreter, fsspec and s3fs imported before imgpack (as a training script may do):
# fsspec's own fork hook then runs first in each worker and empties its instance cache there.
PARENT_AFTER_WORKERS = textwrap.dedent(
    """
    import json, os, sys, time
    import fsspec, s3fs

    parent, closed_elsewhere = os.getpid(), []
    close_session = s3fs.S3FileSystem.close_session
    def spy(loop, client):
        if os.getpid() != parent:
            with open(sys.argv[3], "a") as out:
                out.write(f"{os.getpid()}\\n")
        return close_session(loop, client)
    s3fs.S3FileSystem.close_session = staticmethod(spy)

    from readers import open_iterable
    from readers.datasets.loader import make_loader

    url, options = sys.argv[1], json.loads(sys.argv[2])
    seconds = []
    for epoch in range(2):
        started = time.monotonic()
        ds = open_iterable(url, batch_size=8, crop=32, seed=0, storage_options=options)
        seconds.append(time.monotonic() - started)  # the manifest: a request on a pooled connection
        count = sum(len(x) for x, _ in make_loader(ds, num_workers=2))
    print(json.dumps({"opens": seconds, "count": count}))
    """
)


def test_the_parents_connections_survive_its_workers_when_s3fs_came_first(s3, packed, tmp_path):
    fs, options = s3
    local = packed("tar", options={"samples_per_shard": 16}, resize=32, crop=32)
    fs.put(str(local) + "/", f"{BUCKET}/sessions-tar", recursive=True)
    closed = tmp_path / "closed-in-workers.txt"
    env = {**cli_env(), "IMGPACK_REMOTE_TIMEOUT": "400"}  # a lost connection waits its 30 s read timeout
    args = [f"s3://{BUCKET}/sessions-tar", json.dumps(options), str(closed)]
    done = subprocess.run(
        [sys.executable, "-c", PARENT_AFTER_WORKERS, *args], capture_output=True, text=True, env=env,
        cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["count"] == 44
    assert not closed.exists(), f"workers closed the parent's S3 sessions: {closed.read_text()}"
    assert "attached to a different loop" not in done.stderr
    assert result["opens"][1] < 10, result  # before the fix: ~30 s, the read timeout


WORKER_SESSION = textwrap.dedent(
    """
    import json, multiprocessing, sys
    from readers.remote.urls import url_fs

    url, options = sys.argv[1], json.loads(sys.argv[2])
    fs, path = url_fs(url, options)
    fs.cat_file(path + "/manifest.json")
    parents = id(fs.session.get_component("data_loader"))

    def worker(out):
        child, child_path = url_fs(url, options)
        child.cat_file(child_path + "/manifest.json")
        out.put((child is not fs, id(child.session.get_component("data_loader"))))

    queue = multiprocessing.get_context("fork").Queue()
    process = multiprocessing.get_context("fork").Process(target=worker, args=(queue,))
    process.start()
    new_filesystem, loader = queue.get(timeout=120)
    process.join()
    print(json.dumps({"new_filesystem": new_filesystem, "same_loader": loader == parents}))
    """
)


def test_a_workers_new_session_reuses_the_parents_service_models(s3, packed):
    fs, options = s3
    local = packed("tar", options={"samples_per_shard": 16}, resize=32, crop=32)
    fs.put(str(local) + "/", f"{BUCKET}/sessions-models", recursive=True)
    args = [f"s3://{BUCKET}/sessions-models", json.dumps(options)]
    done = subprocess.run(
        [sys.executable, "-c", WORKER_SESSION, *args], capture_output=True, text=True, env=cli_env(),
        cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"new_filesystem": True, "same_loader": True}
