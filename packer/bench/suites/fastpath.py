"""Benchmark the batch fast path against imgpack's per-sample path, webdataset and FFCV.

Workloads (identical for every system; 2 loader workers, batch 64, shuffled, uint8 output):
- W_jpeg: stored JPEG q90, shorter side 256; read = decode, centre crop 224, (B, 3, 224, 224) + labels;
- W_raw: stored raw uint8 224x224x3 (resize 256, centre crop 224 at packing); read = that tensor + labels;
- W_train: the training read of W_jpeg's data: RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3)
  + horizontal flip p=0.5, (B, 3, 224, 224) uint8 + labels. Contenders: ``imgpack-batch``
  (``crop=RandomResizedCrop(224), flip=True``), ``imgpack-sample`` (the per-sample path with the same
  arguments), ``imagefolder`` (Pillow on the original files, torchvision's transform) and ``ffcv``
  (``RandomResizedCropRGBImageDecoder((224, 224))`` + ``RandomHorizontalFlip()``). The report adds
  the per-core decode limit of this workload (one process, no DataLoader) and what each step costs.
- W_jpeg_full, W_train_full (not run by default): the same two reads of JPEGs stored at the source
  folder's own size (q90, no resize at packing; FFCV's writer keeps the full size too), where DCT
  scaling and the decoded window combine. W_jpeg_full resizes the shorter side to 256 and takes the
  centre 224 (FFCV: ``CenterCropRGBImageDecoder(ratio=224/256)``, ImageFolder: Pillow resize + crop).
  ``pack bench run bench_data --size 667x500`` makes a folder with shorter sides around 500 px.

Each contender runs in its own fresh process, several rounds, contenders interleaved and every other
round in reverse order (workloads too), so that the load from other users of the machine and any
drift over the run fall on all of them alike. Per run: time to first batch
(from building the loader, workers included, to the first batch in hand), images/s of a warm
epoch (best of the epochs after the first full one) and the peak PSS (proportional set size:
shared pages counted once) of the loader's process tree, sampled from outside every
``--memory-interval`` seconds (``packer.bench.harness``: the sampler and epoch timer of ``pack bench``).

Contenders: ``imgpack-batch`` (``open_iterable(batch_size=64)``, DataLoader ``batch_size=None``),
``imgpack-sample`` (per-sample ``open_iterable`` + DataLoader collation), ``webdataset`` (tar shards
written with ``webdataset.ShardWriter``; simplejpeg decode, ``.batched(64)`` in the workers, its
fastest set-up) and ``ffcv`` (``.beton`` with numba threads) when ``--ffcv-python`` names a Python
with FFCV installed (FFCV is a benchmark peer only, never a dependency of imgpack).

    pack bench run bench_data --n 2000 --out /tmp/imgpack-bench/n2000
    pack bench run fastpath --src /tmp/imgpack-bench/n2000 --out /tmp/imgpack-bench/fastpath \\
        --ffcv-python /work/ffcv-venv/bin/python --rounds 3
    pack bench run fastpath ... --workloads W_train W_jpeg W_train_full W_jpeg_full

Each contender runs in ``packer.bench.suites.fastpath_child`` (import-light, so the FFCV
interpreter runs it too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from packer.bench.harness import code_env, run_measured
from packer.bench.suites.fastpath_child import (
    CONTENDERS,
    CROP,
    DEFAULT_WORKLOADS,
    DESIGN_FFCV,
    JPEG_READS,
    PEERS,
    TRAIN_READS,
    WORKLOADS,
)

CHILD = "packer.bench.suites.fastpath_child"  # run by the FFCV interpreter too

# -- data preparation (product venv) -----------------------------------------------------------
def prepare(
    src: Path, out: Path, ffcv_python: str | None, workloads: list[str], shards: int = 8
) -> dict[str, dict[str, str]]:
    """Every stored dataset the ``workloads`` read (made once, reused by later runs)."""
    from packer.bench.prepare import ensure_packed
    from readers.formats.packed_sample import PreprocessSpec

    paths: dict[str, dict[str, str]] = {}
    specs = {
        "W_jpeg": PreprocessSpec(resize=256, encode="jpeg", quality=90),
        "W_raw": PreprocessSpec(resize=256, crop=CROP, encode="raw"),
        "W_jpeg_full": PreprocessSpec(encode="jpeg", quality=90),  # the source's own size
    }
    wanted = {TRAIN_READS.get(w, w) for w in workloads}
    for workload, spec in specs.items():
        if workload not in wanted:
            continue
        lmdb_path = ensure_packed(src, out / f"{workload}.lmdb", "lmdb", spec)
        paths[workload] = {"lmdb": str(lmdb_path), "src": str(src)}
        if any("webdataset" in PEERS[w] for w in workloads if TRAIN_READS.get(w, w) == workload):
            tar_dir = out / f"{workload}-wds"
            if not (tar_dir / "done").exists():
                write_webdataset(lmdb_path, tar_dir, shards)
            paths[workload]["wds"] = str(tar_dir)
        if ffcv_python:
            beton = out / f"{workload}.beton"
            if not beton.exists():
                export = out / f"{workload}-export"
                export_arrays(lmdb_path, export)
                subprocess.run(
                    [
                        ffcv_python,
                        "-m",
                        CHILD,
                        "--child",
                        "ffcv-write",
                        "--workload",
                        workload,
                        "--data",
                        str(export),
                        "--beton",
                        str(beton),
                    ],
                    check=True,
                )
            paths[workload]["beton"] = str(beton)
    for train, stored in TRAIN_READS.items():  # the same stored data, read for training
        if stored in paths:
            paths[train] = paths[stored]
    return paths


def write_webdataset(lmdb_path: Path, tar_dir: Path, shards: int) -> None:
    import webdataset as wds

    from readers.formats import open_reader

    reader = open_reader(lmdb_path)
    tar_dir.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(reader) // shards)
    with wds.ShardWriter(str(tar_dir / "shard-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(len(reader)):
            rec = reader.read(i)
            ext = "jpg" if rec.encoding == "jpeg" else "rgb"
            sink.write(
                {
                    "__key__": f"{i:07d}",
                    ext: bytes(rec.data),
                    "cls": str(rec.label).encode(),
                    "shape": f"{rec.height},{rec.width},{rec.channels}".encode(),
                }
            )
    (tar_dir / "done").write_text("ok")


def export_arrays(lmdb_path: Path, export: Path) -> None:
    """Decoded images (HWC uint8, concatenated) for FFCV's writer, which encodes them itself."""
    import numpy as np

    from readers.formats import open_reader
    from readers.image.decode import decode_array

    reader = open_reader(lmdb_path)
    export.mkdir(parents=True, exist_ok=True)
    shapes, labels, chunks = [], [], []
    for i in range(len(reader)):
        rec = reader.read(i)
        image = decode_array(rec)
        shapes.append(image.shape)
        labels.append(rec.label)
        chunks.append(image.reshape(-1))
    np.save(export / "pixels.npy", np.concatenate(chunks))
    np.save(export / "shapes.npy", np.array(shapes, dtype=np.int64))
    np.save(export / "labels.npy", np.array(labels, dtype=np.int64))


# -- the parent: run children, sample their memory ---------------------------------------------
def run_child(python: str, name: str, workload: str, paths: dict, args: argparse.Namespace) -> dict:
    """One contender in a fresh process, the peak PSS of its process tree sampled from outside.

    Reading PSS walks page tables: sampled often, it steals CPU from multi-process loaders (one
    walk per process) far more than from FFCV's threads, hence ``--memory-interval``."""
    cmd = [python, "-m", CHILD, "--child", name, "--workload", workload, "--paths", json.dumps(paths)]
    cmd += ["--epochs", str(args.epochs), "--workers", str(args.workers), "--batch", str(args.batch)]
    run = run_measured(cmd, args.memory_interval, args.timeout, check=False, env=code_env())
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {run.returncode}"}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["peak_pss_mib"] = (run.peak_pss_bytes or run.peak_rss_bytes) / 2**20
    result["warm_rate"] = max(result["rates"][1:]) if len(result["rates"]) > 1 else result["rates"][0]
    return result


def decode_limit(lmdb: str, batch: int, rounds: int = 2) -> dict[str, float]:
    """The training read in one process, one thread, no DataLoader: img/s per core and the cost of
    each step in microseconds per image (best of ``rounds``)."""
    import numpy as np
    import simplejpeg

    from readers import RandomResizedCrop
    from readers.batch.batch_assembler import BatchAssembler, _mirror, resize_into
    from readers.formats import open_reader

    reader = open_reader(lmdb)
    n = len(reader)
    assembler = BatchAssembler("CHW", RandomResizedCrop(CROP), fast_dct=True, flip=True, seed=0)
    out = np.empty((batch, CROP, CROP, 3), np.uint8)
    spans = [np.arange(a, min(a + batch, n)) for a in range(0, n, batch)]

    def read():
        return [reader.read_many(idx) for idx in spans]

    def params(records):
        return [p for rs, idx in zip(records, spans) for p in assembler.params(rs, idx, 1)]

    def decode(records):
        return [simplejpeg.decode_jpeg(r.data, fastdct=True) for rs in records for r in rs]

    def resize_flip(decoded, flat):
        for i, (image, (window, flip)) in enumerate(zip(decoded, flat)):
            top, left, h, w = window
            resize_into(image[top : top + h, left : left + w], out[i % batch])
            if flip:
                _mirror(out[i % batch])

    def whole(records):
        for rs, idx in zip(records, spans):
            assembler(rs, out[: len(rs)], idx, 1)

    best: dict[str, float] = {}

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        result = fn(*args)
        best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) / n * 1e6)
        return result

    for _ in range(rounds):
        records = timed("read_us", read)
        flat = timed("params_us", params, records)
        decoded = timed("decode_us", decode, records)
        timed("resize_flip_us", resize_flip, decoded, flat)
        timed("whole_us", whole, records)
    best["img_per_s_per_core"] = 1e6 / best["whole_us"]
    return best


def decode_ceiling(lmdb: str, rounds: int = 2) -> float:
    """W_jpeg's ceiling: img/s of the fast-IDCT decode alone (simplejpeg, the stored bytes already
    in memory) on one core, best of ``rounds``; times the cores, what no loader can beat."""
    import simplejpeg

    from readers.formats import open_reader

    reader = open_reader(lmdb)
    data = [bytes(reader.read(i).data) for i in range(len(reader))]
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for blob in data:
            simplejpeg.decode_jpeg(blob, fastdct=True)
        best = min(best, time.perf_counter() - t0)
    return len(data) / best


def measure_limits(
    workload: str,
    paths: dict,
    batch: int,
    round_: int,
    limits: dict[str, dict[str, float]],
    ceilings: dict[str, float],
) -> None:
    """This round's decode ceiling (centre-crop reads) or per-core limit (training reads) of
    ``workload``, kept in ``ceilings`` / ``limits`` (the best over rounds)."""
    if workload in JPEG_READS:
        per_core = decode_ceiling(paths[workload]["lmdb"])
        ceilings[workload] = max(ceilings.get(workload, 0.0), per_core)
        print(f"round {round_} {workload} decode ceiling: {per_core:.0f} img/s per core", flush=True)
    if workload in TRAIN_READS:
        step = decode_limit(paths[workload]["lmdb"], batch)
        best = limits.get(workload, step)
        limits[workload] = {
            k: min(v, step[k]) if k.endswith("_us") else max(v, step[k]) for k, v in best.items()
        }
        print(f"round {round_} {workload} decode limit: {json.dumps(step)}", flush=True)


def round_plan(workloads: list[str], contenders: list[str], round_: int) -> list[tuple[str, str]]:
    """The (workload, contender) runs of round ``round_``, in order: every other round reversed
    (workloads and the contenders within each), so that none always runs first or last."""
    plan = [(w, name) for w in workloads for name in contenders if name in PEERS[w]]
    return plan if round_ % 2 == 0 else plan[::-1]


def summarise(
    runs: dict,
    ffcv_measured: bool,
    limits: dict[str, dict[str, float]] | None = None,
    ceilings: dict[str, float] | None = None,
) -> str:
    """The report: per workload, each contender's median rate; training reads add their per-core
    decode limit (``limits``), centre-crop reads their decode ceiling (``ceilings``)."""
    lines = []
    for workload in WORKLOADS:
        if not any(w == workload for w, _ in runs):
            continue
        limit = (limits or {}).get(workload)
        ceiling = (ceilings or {}).get(workload)
        lines.append(f"\n{workload}: img/s warm epoch (median of rounds), first batch s, peak PSS MiB")
        base = None
        table = {}
        for name in CONTENDERS:
            ok = [r for r in runs.get((workload, name), []) if "error" not in r]
            if not ok:
                errors = [r["error"] for r in runs.get((workload, name), [])]
                if errors:
                    lines.append(f"  {name:15s} failed: {errors[0]}")
                continue
            table[name] = (
                statistics.median(r["warm_rate"] for r in ok),
                statistics.median(r["first_batch_s"] for r in ok),
                max(r["peak_pss_mib"] for r in ok),
            )
        base = table.get("ffcv")
        folder = table.get("imagefolder")
        for name, (rate, first, mem) in table.items():
            ratio = f"  {rate / base[0]:.2f}x FFCV rate, {mem / base[2]:.2f}x FFCV memory" if base else ""
            ratio += f", {rate / folder[0]:.2f}x ImageFolder" if folder else ""
            lines.append(f"  {name:15s} {rate:9.0f} img/s  first {first:5.2f} s  peak {mem:7.0f} MiB{ratio}")
        if limit and "imgpack-batch" in table:
            cores = os.cpu_count() or 1
            steps = ", ".join(f"{k[:-3]} {v:.0f}" for k, v in limit.items() if k.endswith("_us"))
            lines.append(
                f"  decode limit: {limit['img_per_s_per_core']:.0f} img/s per core (us/image: {steps}); "
                f"imgpack-batch reaches {table['imgpack-batch'][0] / limit['img_per_s_per_core']:.2f} "
                f"cores' worth on this {cores}-CPU machine"
            )
        if ceiling and "imgpack-batch" in table:
            cores = os.cpu_count() or 1
            top = ceiling * cores
            lines.append(
                f"  decode ceiling: {ceiling:.0f} img/s per core (fast-IDCT decode alone) x {cores} cores "
                f"= {top:.0f}; imgpack-batch reaches {table['imgpack-batch'][0] / top:.2f} of it"
            )
        if not ffcv_measured and "imgpack-batch" in table and workload in DESIGN_FFCV:
            ref = DESIGN_FFCV[workload]
            lines.append(
                f"  (FFCV not measured; DESIGN.md reference figure {ref} img/s on another 2-core "
                f"machine: imgpack-batch is {table['imgpack-batch'][0] / ref:.2f}x that, not comparable)"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", type=Path, default=Path("/tmp/imgpack-bench/n2000"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/imgpack-bench/fastpath"))
    parser.add_argument("--ffcv-python", default=None, help="a Python with FFCV installed (optional)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is warm-up")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--only", nargs="*", default=None, help="contenders to run")
    parser.add_argument("--workloads", nargs="*", default=list(DEFAULT_WORKLOADS), choices=WORKLOADS)
    parser.add_argument(
        "--memory-interval",
        type=float,
        default=1.0,
        help="seconds between memory samples (one PSS sample of a 2-worker loader costs ~20-30 ms of CPU)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    paths = prepare(args.src, args.out, args.ffcv_python, args.workloads)
    contenders = [c for c in (args.only or CONTENDERS) if c != "ffcv" or args.ffcv_python]
    runs: dict = {}
    limits: dict[str, dict[str, float]] = {}
    ceilings: dict[str, float] = {}
    for round_ in range(args.rounds):
        measured: set[str] = set()
        for workload, name in round_plan(args.workloads, contenders, round_):
            if workload not in measured:  # the per-core figures, between the contenders' runs like them
                measured.add(workload)
                measure_limits(workload, paths, args.batch, round_, limits, ceilings)
            python = args.ffcv_python if name == "ffcv" else sys.executable
            result = run_child(python, name, workload, paths, args)
            runs.setdefault((workload, name), []).append(result)
            shown = {k: v for k, v in result.items() if k != "rates"}
            print(f"round {round_} {workload} {name}: {json.dumps(shown)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({f"{w}|{n}": r for (w, n), r in runs.items()}, indent=1))
    print(summarise(runs, "ffcv" in contenders, limits, ceilings))


if __name__ == "__main__":
    main()
