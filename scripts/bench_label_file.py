"""Manifest size and open time of a shuffled tar pack: labels in ``labels.i64`` against the
older ``extra.label_runs`` in manifest.json (one [label, count] run per sample once shuffled).

Builds one synthetic tar dataset of ``--samples`` samples (real ``.idx`` sidecars, sparse shards
whose bytes are never read; labels a seeded shuffle of ``--classes`` classes), then gives it
either manifest in turn, alternating, and times opening the reader plus its first ``labels()``.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_label_file.py --samples 200000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from readers.formats import open_reader  # noqa: E402
from readers.formats.label_file import LABELS_DTYPE, LABELS_NAME, labels_entry  # noqa: E402
from readers.manifest import MANIFEST_NAME, read_manifest, write_manifest  # noqa: E402
from scripts.bench_reader_index_memory import make_tar  # noqa: E402


def runs_of(labels: np.ndarray) -> list[list[int]]:
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    counts = np.diff(np.r_[starts, len(labels)])
    return [[int(v), int(c)] for v, c in zip(labels[starts], counts)]


def give_labels(root: Path, labels: np.ndarray, how: str, classes: int) -> int:
    """Rewrite the manifest to hold the labels ``how`` ("file" or "runs"); its size in bytes."""
    manifest = read_manifest(root)
    manifest.classes = [f"c{k}" for k in range(classes)]
    manifest.extra.pop("label_runs", None)
    manifest.extra.pop("labels", None)
    if how == "file":
        data = labels.astype(LABELS_DTYPE).tobytes()
        (root / LABELS_NAME).write_bytes(data)
        manifest.extra["labels"] = labels_entry(data)
    else:
        manifest.extra["label_runs"] = runs_of(labels)
    write_manifest(root, manifest)
    return (root / MANIFEST_NAME).stat().st_size


def open_time(root: Path) -> tuple[float, float]:
    """Seconds to open the reader (manifest read and checked) and then to have every label."""
    start = time.perf_counter()
    reader = open_reader(root)
    opened = time.perf_counter()
    reader.labels()
    return opened - start, time.perf_counter() - opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-part", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="imgpack-labelfile-"))
    try:
        root = work / "tar"
        make_tar(root, args.samples, args.per_part)
        labels = np.random.default_rng(0).integers(0, args.classes, args.samples)
        sizes: dict[str, int] = {}
        times: dict[str, list[tuple[float, float]]] = {"runs": [], "file": []}
        for r in range(args.rounds):
            for how in ("runs", "file") if r % 2 == 0 else ("file", "runs"):
                sizes[how] = give_labels(root, labels, how, args.classes)
                open_time(root)  # warm the page cache: the files, not the disk, are measured
                times[how].append(open_time(root))
        median = {how: statistics.median(t[0] for t in times[how]) for how in times}
        for how in ("runs", "file"):
            labelled = statistics.median(t[1] for t in times[how])
            print(
                f"{how:5s} n={args.samples:,}: manifest.json {sizes[how] / 1e6:7.2f} MB  open "
                f"{median[how] * 1e3:7.1f} ms  + labels() {labelled * 1e3:6.1f} ms  (median)"
            )
        print(
            f"open time, label_runs / label file: {median['runs'] / median['file']:.0f}x; "
            f"manifest {sizes['runs'] / sizes['file']:.0f}x smaller"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
