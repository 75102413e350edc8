"""Memory of a pack's bookkeeping against the number of source files (issue 15, "flat memory").

Builds a synthetic ImageFolder of N empty ``.JPEG`` files (100 classes, ImageNet-like names; the
scan never opens them), then measures, each in a fresh process:
- ``scan``: ``scan_folder`` alone;
- ``pack``: a whole ``pack_folder`` (scan, fingerprint, parts, progress file, the source stream
  the workers are fed from, manifest) with decoding and writing replaced by no-ops, so only the
  engine's own per-sample structures are counted.
Reported: peak RSS growth over the process after its imports (``ru_maxrss``; it counts the pages
of the scan's memory-mapped table that were touched), peak anonymous memory growth (RssAnon,
sampled every 5 ms: the process's own memory), and PSS at the end.

    pack bench run scan_memory --sizes 20000 200000 1000000
    pack bench run scan_memory --code /work/main   # another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packer.bench.harness import CODE_ROOT

CLASSES = 100
PER_DIR = 1000  # files per sub-folder inside a class, so folders stay of a realistic size

CHILD = r"""
import json, os, resource, sys, tempfile
from pathlib import Path

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

def pss_kib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1])

mode, src = sys.argv[1], sys.argv[2]
import numpy  # noqa: F401  (imports count in the baseline, not in the growth)
import packer.engine.pack_run as engine
import packer.engine._local_engine as local_engine
import packer.engine._pool as pool
from packer.sources.source import scan_folder
from readers.errors import ImgpackError

base, base_anon = rss_kib(), anon_kib()
peak_anon = [base_anon]

def sample_anon():  # peak anonymous memory: mapped file pages (the scan's table) left out
    import time
    while True:
        peak_anon[0] = max(peak_anon[0], anon_kib())
        time.sleep(0.005)

import threading
threading.Thread(target=sample_anon, daemon=True).start()
count = 0
if mode == "scan":
    scan = scan_folder(src)
    count = len(scan.items)
else:
    seen = [0]

    def chunk(items, spec, *rest):
        return [(item.index, item.rel, "not decoded (memory benchmark)") for item in items]

    real_write_part = local_engine.write_part

    def write_part(writer, part, results, *rest, **options):
        def counted():
            for result in results:
                seen[0] += 1
                yield result
        return real_write_part(writer, part, counted(), *rest, **options)

    pool.preprocess_chunk = chunk  # every file a skip: the scan and the pipeline, no decoding
    local_engine.write_part = write_part
    with tempfile.TemporaryDirectory() as out:
        try:
            engine.pack_folder(src, Path(out) / "out", "tar", workers=1)
        except ImgpackError:
            pass  # "every image was skipped": nothing was written, as intended
    count = seen[0]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
anon = max(peak_anon[0], anon_kib()) - base_anon
print(json.dumps({"count": count, "base_mib": base / 1024, "peak_growth_mib": (peak - base) / 1024,
                  "anon_growth_mib": anon / 1024,
                  "pss_mib": pss_kib() / 1024}))
"""


def build_tree(root: Path, n: int) -> None:
    """``n`` empty files spread over CLASSES classes, PER_DIR per sub-folder."""
    per_class = -(-n // CLASSES)
    flags = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC
    for c in range(CLASSES):
        count = max(0, min(per_class, n - c * per_class))
        for i in range(0, count, PER_DIR):
            folder = root / f"n{c:08d}" / f"part{i // PER_DIR:04d}"
            folder.mkdir(parents=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # names made relative to it: fast
            try:
                for k in range(i, min(i + PER_DIR, count)):
                    os.close(os.open(f"n{c:08d}_{k:08d}.JPEG", flags, 0o644, dir_fd=fd))
            finally:
                os.close(fd)


def measure(code: Path, mode: str, src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(src)], env=env, cwd=code, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} on {src} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument(
        "--code",
        type=Path,
        default=CODE_ROOT,
        help="checkout whose packer is measured (default: this one)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the trees go (default: /tmp)")
    parser.add_argument("--modes", nargs="+", default=["scan", "pack"], choices=["scan", "pack"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="imgpack-scanmem-", dir=args.dir))
    try:
        for n in args.sizes:
            src = work / f"tree-{n}"
            if not src.exists():
                build_tree(src, n)
            for mode in args.modes:
                row = measure(args.code.resolve(), mode, src)
                per = row["peak_growth_mib"] * 2**20 / max(1, n)
                print(
                    f"{mode:4s} n={n:>9,}  peak RSS growth {row['peak_growth_mib']:8.1f} MiB "
                    f"({per:6.1f} B/file)  peak anonymous {row.get('anon_growth_mib', 0):6.1f} MiB  "
                    f"PSS at end {row['pss_mib']:7.1f} MiB  "
                    f"(baseline {row['base_mib']:.0f} MiB, {row['count']:,} items)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
