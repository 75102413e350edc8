"""A reader's per-process index memory against the number of samples (issue 15, "flat memory").

Builds synthetic datasets whose indexes are real and whose image bytes are never read: tar
shards (sparse files of the right size, real ``.idx`` sidecars) and HDF5 parts (real files with
empty images), ``--samples`` samples in parts of ``--per-part``. Then, in a fresh process (what a
DataLoader worker is), opens the reader and loads the index of every part (what a worker that
touches every part holds), and reports the RSS growth and the Python objects created, per sample.

    pack bench run reader_index_memory --samples 1000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from packer.bench.harness import CODE_ROOT, code_env
from readers.formats.hdf5.reader import MANIFEST_ATTR
from readers.formats.hdf5.reader import shard_name as h5_name
from readers.formats.tar.reader import format_index, index_name, sample_key, shard_name
from readers.store.manifest import Manifest, Shard, write_manifest

CHILD = r"""
import gc, json, sys
from readers.formats import open_reader

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

reader = open_reader(sys.argv[1])
gc.collect()
objects, base = len(gc.get_objects()), rss_kib()
for position in range(len(reader.manifest.shards)):
    reader.handle(position)
gc.collect()
print(json.dumps({"samples": len(reader), "growth_kib": rss_kib() - base,
                  "objects": len(gc.get_objects()) - objects}))
"""


def _manifest(fmt: str, shards: list[Shard], n: int) -> Manifest:
    return Manifest(fmt, n, ["a", "b"], "jpeg", {}, shards, extra={"label_runs": [[0, n]]})


def make_tar(root: Path, n: int, per_part: int) -> None:
    root.mkdir(parents=True)
    shards = []
    for position, first in enumerate(range(0, n, per_part)):
        count = min(per_part, n - first)
        samples, offset = [], 0
        for k in range(first, first + count):
            key = sample_key(k)
            samples.append([("jpg", offset + 512, 100, f"{key}.jpg"), ("cls", offset + 1536, 1, f"{key}.cls"),
                            ("json", offset + 2560, 80, f"{key}.json")])  # fmt: skip
            offset += 3072
        name = shard_name(position)
        (root / index_name(name)).write_text(format_index(samples))
        with open(root / name, "wb") as fh:
            fh.truncate(offset + 1024)  # sparse: the bytes are never read here
        shards.append(Shard(name, first, count, offset + 1024, "0" * 64))
    write_manifest(root, _manifest("tar", shards, n))


def make_hdf5(root: Path, n: int, per_part: int) -> None:
    import h5py

    root.mkdir(parents=True)
    shards = []
    for position, first in enumerate(range(0, n, per_part)):
        count = min(per_part, n - first)
        name = h5_name(position)
        with h5py.File(root / name, "w") as fh:
            fh.create_dataset("images", data=np.zeros(0, np.uint8))
            fh.create_dataset("offsets", data=np.zeros(count + 1, np.int64))
            fh.create_dataset("shapes", data=np.tile(np.array([1, 1, 3], np.int32), (count, 1)))  # 1x1 RGB
            fh.create_dataset("labels", data=np.zeros(count, np.int64))
            fh.create_dataset("crc32", data=np.zeros(count, np.uint32))
            fh.attrs[MANIFEST_ATTR] = "{}"
        shards.append(Shard(name, first, count, (root / name).stat().st_size, "0" * 64))
    write_manifest(root, _manifest("hdf5", shards, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--per-part", type=int, default=10_000)
    parser.add_argument("--formats", nargs="+", default=["tar", "hdf5"], choices=["tar", "hdf5"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="imgpack-readermem-"))
    env = code_env()
    try:
        for n in args.samples:
            for fmt in args.formats:
                root = work / f"{fmt}-{n}"
                (make_tar if fmt == "tar" else make_hdf5)(root, n, args.per_part)
                proc = subprocess.run([sys.executable, "-c", CHILD, str(root)], env=env, cwd=CODE_ROOT,
                                      capture_output=True, text=True, check=True)  # fmt: skip
                row = json.loads(proc.stdout.splitlines()[-1])
                print(
                    f"{fmt:5s} n={n:>9,} parts={-(-n // args.per_part):>5}  index memory "
                    f"{row['growth_kib'] / 1024:7.1f} MiB ({row['growth_kib'] * 1024 / n:5.1f} B/sample)  "
                    f"Python objects {row['objects']:>7,} ({row['objects'] / n:.3f}/sample)",
                    flush=True,
                )
                shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
