"""Many ranks, many samples: a synthetic pack of tiny images read by a real gloo group.

    pack bench run many_ranks --samples 100000,1280000 --formats lmdb,hdf5 \\
        --ranks 16 --resume-ranks 12 --workers 2

For each (format, size) a pack of ``samples`` 16x16 JPEGs is made (a few hundred distinct
images, each sample carrying its source number as the field ``idx``; reused from ``--workdir``
when there). Then ``ranks`` processes form a torch.distributed gloo group on the CPU and each
reads one epoch through ``make_loader`` with ``workers`` DataLoader workers, recording the ``idx``
of every sample it is handed; rank 0 saves the loader state after ``step`` batches (near the
middle of the epoch). Then ``resume_ranks`` new processes load that state (elastic: another world
size) and read the rest of the epoch. The parent checks, from the ranks' saved indices:

- every sample exactly once in the epoch across the ranks, and equal counts per rank;
- the union of what the first group read before the checkpoint and what the second group read
  after it is every sample exactly once (``step`` is chosen so no padding is needed, if it can be).

Each rank also reports its memory (PSS of the rank process and its workers, peak over the epoch,
``readers`` sampled every 2 s), the time ``open_iterable`` took, the time to its first batch and
the size of the saved state (JSON and ``torch.save``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

DISTINCT = 500  # distinct images in a synthetic pack; samples repeat them through symlinked folders
SIDE = 16
BATCH = 256
SEED = 5


# -- the synthetic pack ------------------------------------------------------------------------
def synthetic_pack(fmt: str, samples: int, workdir: Path, workers: int = 2) -> Path:
    """A pack of ``samples`` tiny JPEGs whose field ``idx`` is the sample's source number (so a
    reader can tell every sample apart); made once per (format, size) under ``workdir``."""
    from PIL import Image

    from packer.scan.rows import Row, pack_rows
    from readers.formats.packed_sample import PreprocessSpec
    from readers.store.manifest import MANIFEST_NAME

    out = workdir / f"{fmt}-{samples}"
    if (out / MANIFEST_NAME).exists():
        return out
    root = workdir / "source"
    base = root / "base"
    if not (base / f"{DISTINCT - 1}.jpg").exists():
        base.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for k in range(DISTINCT):
            pixels = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(base / f"{k}.jpg", quality=90)
    # A row's path must be unique: folder j is a symlink to base, so sample i is l<j>/<k>.jpg.
    for j in range(-(-samples // DISTINCT)):
        link = root / f"l{j}"
        if not link.is_symlink():
            link.symlink_to("base")
    rows = (Row(f"l{i // DISTINCT}/{i % DISTINCT}.jpg", i % 10, {"idx": i}) for i in range(samples))
    spec = PreprocessSpec(encode="original")  # the source bytes as they are: packing stays fast
    classes = [str(c) for c in range(10)]
    pack_rows(rows, root, classes, out, fmt, schema={"idx": "int"}, spec=spec, workers=workers, force=True)
    return out


# -- one rank ----------------------------------------------------------------------------------
@dataclass
class Job:
    path: str
    out: str
    world: int
    workers: int
    step: int  # rank 0 saves the loader state after this many batches
    resume_from: str = ""  # a saved loader state: this group reads the rest of its epoch


def pss_of_tree(pid: int) -> int:
    """PSS (bytes) of ``pid`` and its descendants, from /proc/<pid>/smaps_rollup."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except (OSError, StopIteration):
            continue  # a worker that has just exited
    return total


class PeakPss:
    """The peak PSS of this process tree, sampled by a thread every ``interval`` seconds."""

    def __init__(self, interval: float = 2.0) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def sample(self) -> None:
        self.peak = max(self.peak, pss_of_tree(os.getpid()))

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def rank_main(rank: int, job: Job) -> None:
    import multiprocessing

    # A spawned rank would spawn its DataLoader workers too; under torchrun they fork (Linux).
    multiprocessing.set_start_method("fork", force=True)
    import torch
    import torch.distributed as dist

    from readers import make_loader, open_iterable

    store = Path(job.out, "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=job.world)
    try:
        memory = PeakPss()
        started = time.perf_counter()
        it = open_iterable(job.path, seed=SEED, batch_size=BATCH, crop=SIDE, fields=["idx"])
        opened = time.perf_counter() - started
        loader = make_loader(it, num_workers=job.workers)
        if job.resume_from:
            loader.load_state_dict(torch.load(job.resume_from, weights_only=True))
        expected_batches = len(loader)
        seen: list[np.ndarray] = []
        first_batch = state_json = state_torch = 0.0
        started = time.perf_counter()
        for step, (_, target) in enumerate(loader):
            if step == 0:
                first_batch = time.perf_counter() - started
            seen.append(target["idx"].numpy())
            if step + 1 == job.step and not job.resume_from:
                memory.sample()
                state = loader.state_dict()
                buffer = io.BytesIO()
                torch.save(state, buffer)
                state_json, state_torch = len(json.dumps(state)), buffer.tell()
                if rank == 0:
                    Path(job.out, "state.pt").write_bytes(buffer.getvalue())
        memory.sample()
        peak = memory.stop()
        count = sum(len(s) for s in seen)
        counts = torch.tensor([count, -count])
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # what DDP would hang on if counts differed
        indices = np.concatenate(seen) if seen else np.zeros(0, np.int64)
        before = sum(len(s) for s in seen[: job.step]) if not job.resume_from else 0
        np.save(Path(job.out, f"rank{rank}.npy"), indices)
        report = {
            "rank": rank, "samples": count, "batches": len(seen), "expected_batches": expected_batches,
            "max_count": int(counts[0]), "min_count": -int(counts[1]), "before_checkpoint": before,
            "pss": peak, "open_s": opened, "first_batch_s": first_batch,
            "state_json_bytes": state_json, "state_torch_bytes": state_torch,
        }  # fmt: skip
        Path(job.out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def run_group(job: Job) -> list[dict[str, Any]]:
    """``job.world`` ranks (spawned processes in a gloo group); their reports, rank by rank."""
    import torch.multiprocessing as mp

    out = Path(job.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        mp.spawn(rank_main, args=(job,), nprocs=job.world, join=True)
    finally:
        os.environ.update(env)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(job.world)]


def read_indices(out: str | Path, world: int) -> list[np.ndarray]:
    return [np.load(Path(out, f"rank{r}.npy")) for r in range(world)]


# -- one (format, size) -------------------------------------------------------------------------
def checkpoint_step(samples: int, ranks: int, resume_ranks: int) -> int:
    """The step (batches per rank) near mid-epoch at which the rest of the epoch splits over
    ``resume_ranks`` without padding, if there is one (else mid-epoch)."""
    per_rank = samples // ranks // BATCH
    middle = max(1, per_rank // 2)
    for delta in range(per_rank // 4 + 1):
        for step in (middle - delta, middle + delta):
            if 1 <= step <= per_rank and (samples - step * ranks * BATCH) % resume_ranks == 0:
                return step
    return middle


@dataclass
class Result:
    fmt: str
    samples: int
    exactly_once: bool
    equal_counts: bool
    resume_exact: bool
    pss_mib: float  # the largest rank's (rank process + its workers)
    open_s: float  # the slowest rank's
    first_batch_s: float
    state_json_bytes: int
    state_torch_bytes: int
    epoch_s: float
    resume_pss_mib: float
    resume_first_batch_s: float


def coverage(parts: list[np.ndarray], samples: int) -> np.ndarray:
    """How often each sample was read across ``parts``."""
    return np.bincount(np.concatenate(parts), minlength=samples) if parts else np.zeros(samples, np.int64)


def measure(fmt: str, samples: int, ranks: int, resume_ranks: int, workers: int, workdir: Path) -> Result:
    path = synthetic_pack(fmt, samples, workdir)
    step = checkpoint_step(samples, ranks, resume_ranks)
    first = Job(str(path), str(workdir / "run-first"), ranks, workers, step)
    started = time.perf_counter()
    reports = run_group(first)
    epoch_s = time.perf_counter() - started
    parts = read_indices(first.out, ranks)
    state = str(workdir / "run-first" / "state.pt")
    rest = Job(str(path), str(workdir / "run-resumed"), resume_ranks, workers, 0, state)
    resumed = run_group(rest)
    before = [p[: r["before_checkpoint"]] for p, r in zip(parts, reports)]
    union = coverage(before + read_indices(rest.out, resume_ranks), samples)
    counts = {r[k] for r in reports for k in ("samples", "max_count", "min_count")}
    mib = 1 << 20
    return Result(
        fmt, samples,
        exactly_once=bool((coverage(parts, samples) == 1).all()),
        equal_counts=len(counts) == 1 and all(r["batches"] == r["expected_batches"] for r in reports),
        resume_exact=bool((union == 1).all()) and len({r["samples"] for r in resumed}) == 1,
        pss_mib=max(r["pss"] for r in reports) / mib,
        open_s=max(r["open_s"] for r in reports),
        first_batch_s=max(r["first_batch_s"] for r in reports),
        state_json_bytes=reports[0]["state_json_bytes"], state_torch_bytes=reports[0]["state_torch_bytes"],
        epoch_s=epoch_s,
        resume_pss_mib=max(r["pss"] for r in resumed) / mib,
        resume_first_batch_s=max(r["first_batch_s"] for r in resumed),
    )  # fmt: skip


HEADER = (
    "| format | samples | exactly once | equal counts | resume exact | PSS/rank MiB | open s | "
    "first batch s | state JSON / torch.save B | epoch s (wall) | resumed: PSS MiB, first batch s |"
)


def table_row(r: Result) -> str:
    yes = {True: "yes", False: "**NO**"}
    return (
        f"| {r.fmt} | {r.samples:,} | {yes[r.exactly_once]} | {yes[r.equal_counts]} | {yes[r.resume_exact]} "
        f"| {r.pss_mib:.0f} | {r.open_s:.3f} | {r.first_batch_s:.2f} | {r.state_json_bytes:,} / "
        f"{r.state_torch_bytes:,} | {r.epoch_s:.0f} | {r.resume_pss_mib:.0f}, {r.resume_first_batch_s:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    about = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(description=about)
    parser.add_argument("--samples", default="100000,1280000", help="pack sizes, comma-separated")
    parser.add_argument("--formats", default="lmdb,hdf5", help="formats, comma-separated")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--resume-ranks", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    scratch = os.path.join(os.environ.get("TMPDIR", "/tmp"), "imgpack-many-ranks")
    parser.add_argument("--workdir", default=scratch, help="packs (kept and reused) and the ranks' files")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of the table")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()  # the gloo file store needs an absolute path
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    if not args.json:
        print(HEADER)
        print("|" + "---|" * (HEADER.count("|") - 1))
    for samples in (int(s) for s in args.samples.split(",")):
        for fmt in args.formats.split(","):
            result = measure(fmt, samples, args.ranks, args.resume_ranks, args.workers, workdir)
            results.append(result)
            print(json.dumps(asdict(result)) if args.json else table_row(result), flush=True)
    ok = all(r.exactly_once and r.equal_counts and r.resume_exact for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
