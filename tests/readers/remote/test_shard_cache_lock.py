"""The shard cache's download lock (readers/remote/urls.py) between threads of one process.

CI once saw two threads of one reader (the read and the read-ahead's hints) download the same
part at once: a ShardCache opened meanwhile unlinked the lock file one of them had opened but not
yet locked, so both held a lock, wrote the same temporary name, and the second rename found its
file gone ("listed in the manifest but not found at the URL").
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading

import fsspec

from readers.remote import urls
from readers.remote.urls import ShardCache, held_lock


def test_a_lock_file_unlinked_before_it_is_locked_is_not_held(tmp_path, monkeypatch):
    path = tmp_path / "x.lock"
    real_flock, unlinked = fcntl.flock, []

    def flock_after_a_clean(fd, op):
        if not unlinked:  # ShardCache.clean removes the file between open and flock
            path.unlink()
            unlinked.append(True)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_clean)
    with held_lock(path) as held:
        assert unlinked and held.exists()  # the lock held is the file at the path, not the orphan
        with open(path, "a+b") as other:
            try:
                real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = False
        assert not taken  # so anyone else opening the path waits


def fetch_together(cache_dir, source, blob: bytes, threads: int = 8) -> tuple[list, list]:
    """``threads`` threads start at once, each opening its own ShardCache on ``cache_dir`` (so
    clean() runs among the downloads, as when a reader and its hint thread open the part) and
    getting ``source``; (paths got, exceptions raised)."""
    fs = fsspec.filesystem("file")
    sha = hashlib.sha256(blob).hexdigest()
    start, got, errors = threading.Barrier(threads), [], []

    def fetch():
        start.wait()
        try:
            cache = ShardCache(cache_dir)
            got.append(cache.get(lambda: (fs, str(source)), str(source), len(blob), sha, suffix=".mdb"))
        except Exception as exc:  # noqa: BLE001 - collected and asserted by the caller
            errors.append(exc)

    running = [threading.Thread(target=fetch) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return got, errors


def test_threads_with_caches_of_their_own_download_a_part_once(tmp_path, monkeypatch):
    blob = os.urandom(300_000)
    source = tmp_path / "part.mdb"
    source.write_bytes(blob)
    downloads, real_download = [], ShardCache._download

    def counted(self, *args):
        downloads.append(threading.get_ident())
        return real_download(self, *args)

    monkeypatch.setattr(ShardCache, "_download", counted)
    for round_ in range(20):
        cache_dir = tmp_path / f"cache{round_}"
        got, errors = fetch_together(cache_dir, source, blob)
        assert errors == []
        assert len(got) == 8 and len(set(got)) == 1 and got[0].read_bytes() == blob
        assert not list(cache_dir.glob(".*.part")) and not list(cache_dir.glob("*.lock"))
    assert len(downloads) == 20  # one download a round, whatever the threads' interleaving


def test_download_names_differ_between_threads(tmp_path):
    names = []
    t = threading.Thread(target=lambda: names.append(urls.part_name(tmp_path / "a.tar")))
    t.start()
    t.join()
    names.append(urls.part_name(tmp_path / "a.tar"))
    assert names[0] != names[1] and all(n.name.endswith(".part") for n in names)
