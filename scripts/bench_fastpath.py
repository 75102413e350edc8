#!/usr/bin/env python3
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
  ``make_bench_data.py --size 667x500`` makes a folder with shorter sides around 500 px.

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

    python scripts/make_bench_data.py --n 2000 --out /tmp/imgpack-bench/n2000
    python scripts/bench_fastpath.py --src /tmp/imgpack-bench/n2000 --out /tmp/imgpack-bench/fastpath \\
        --ffcv-python /work/ffcv-venv/bin/python --rounds 3
    python scripts/bench_fastpath.py ... --workloads W_train W_jpeg W_train_full W_jpeg_full

The child mode (``--child NAME``) runs with only NumPy at import time, so the FFCV interpreter can
run this same file.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The shared timer and sampler; the standard library only at import, so FFCV's Python can run it.
from packer.bench.harness import count_images, run_measured, time_epochs  # noqa: E402

WORKLOADS = ("W_jpeg", "W_raw", "W_train", "W_jpeg_full", "W_train_full")
DEFAULT_WORKLOADS = ("W_jpeg", "W_raw", "W_train")
JPEG_READS = ("W_jpeg", "W_jpeg_full")  # centre-crop reads of stored JPEGs
TRAIN_READS = {"W_train": "W_jpeg", "W_train_full": "W_jpeg_full"}  # training read -> its stored data
CONTENDERS = ("imgpack-batch", "imgpack-sample", "webdataset", "imagefolder", "ffcv")
PEERS = {  # contenders run per workload
    "W_jpeg": ("imgpack-batch", "imgpack-sample", "webdataset", "ffcv"),
    "W_raw": ("imgpack-batch", "imgpack-sample", "webdataset", "ffcv"),
    "W_train": ("imgpack-batch", "imgpack-sample", "imagefolder", "ffcv"),
    "W_jpeg_full": ("imgpack-batch", "imgpack-sample", "imagefolder", "ffcv"),
    "W_train_full": ("imgpack-batch", "imgpack-sample", "imagefolder", "ffcv"),
}
FULL_RESIZE = 256  # W_jpeg_full: shorter side to 256, then the centre 224 (torchvision's eval transform)
CROP = 224
DESIGN_FFCV = {
    "W_jpeg": 4500,
    "W_raw": 44000,
    "W_train": 2700,
}  # DESIGN.md reference (2-core machine), not measured here


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
                        __file__,
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

    from readers.decode import decode_array
    from readers.formats import open_reader

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


# -- loaders (child processes) -----------------------------------------------------------------
def centre_crop_chw(image, size: int = CROP):
    h, w = image.shape[-2:]
    top, left = (h - size) // 2, (w - size) // 2
    return image[..., top : top + size, left : left + size]


def imgpack_loader(name: str, workload: str, paths: dict, workers: int, batch: int):
    from packer.bench.contenders import baseline_path, batch_path, sample_path
    from readers import RandomResizedCrop

    path = paths[workload]["lmdb"]
    crop = CROP if workload in JPEG_READS else None
    resize = FULL_RESIZE if workload == "W_jpeg_full" else None
    train = {"crop": RandomResizedCrop(CROP), "flip": True} if workload in TRAIN_READS else {}

    def build():
        if name == "imagefolder":
            centre = {"resize": resize, "crop": crop} if resize else None
            return baseline_path(paths[workload]["src"], centre, "tensor", batch, workers, **train)[0]
        if name == "imgpack-batch":
            # fast_dct: libjpeg-turbo's fast integer IDCT, the setting FFCV always uses.
            options = train or {"crop": crop, "resize": resize}
            return batch_path(path, batch, workers, shuffle=True, seed=0, fast_dct=True, **options)[0]
        if resize:  # the per-sample path crops and resizes itself, like the batch path
            options = {"shuffle": True, "seed": 0, "decode": "tensor", "crop": crop, "resize": resize}
            return sample_path(path, batch, workers, **options)[0]
        transform = centre_crop_chw if crop else None
        options = {"shuffle": True, "seed": 0, "decode": "tensor", "transform": transform, **train}
        return sample_path(path, batch, workers, **options)[0]

    return build


def wds_loader(workload: str, paths: dict, workers: int, batch: int):
    import glob

    import numpy as np
    import simplejpeg
    import torch
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(paths[workload]["wds"], "shard-*.tar")))

    def jpeg(sample):
        image = simplejpeg.decode_jpeg(sample["jpg"])
        h, w = image.shape[:2]
        top, left = (h - CROP) // 2, (w - CROP) // 2
        return image[top : top + CROP, left : left + CROP], int(sample["cls"])

    def raw(sample):
        shape = tuple(int(v) for v in sample["shape"].split(b","))
        return np.frombuffer(sample["rgb"], dtype=np.uint8).reshape(shape), int(sample["cls"])

    def to_torch(images_labels):
        images, labels = images_labels
        return torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels)

    def build():
        dataset = (
            wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
            .shuffle(500)
            .map(jpeg if workload == "W_jpeg" else raw)
            .batched(batch, partial=True)
            .map(to_torch)
        )
        return torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=workers, persistent_workers=True
        )

    return build


def ffcv_loader(workload: str, paths: dict, workers: int, batch: int):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import (
        CenterCropRGBImageDecoder,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    augment = []
    if workload in JPEG_READS:
        decoder = CenterCropRGBImageDecoder((CROP, CROP), ratio=CROP / 256)
    elif workload in TRAIN_READS:
        decoder = RandomResizedCropRGBImageDecoder((CROP, CROP))
        augment = [RandomHorizontalFlip()]
    else:
        decoder = SimpleRGBImageDecoder()
    pipelines = {
        "image": [decoder, *augment, ToTensor(), ToTorchImage()],
        "label": [IntDecoder(), ToTensor(), Squeeze()],
    }
    return lambda: Loader(
        paths[workload]["beton"],
        batch_size=batch,
        num_workers=workers,
        order=OrderOption.RANDOM,
        seed=0,
        pipelines=pipelines,
        drop_last=False,
        os_cache=True,
    )


def ffcv_write(workload: str, data: str, beton: str) -> None:
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    pixels = np.load(os.path.join(data, "pixels.npy"), mmap_mode="r")
    shapes = np.load(os.path.join(data, "shapes.npy"))
    labels = np.load(os.path.join(data, "labels.npy"))
    offsets = np.concatenate([[0], np.cumsum(shapes.prod(axis=1))])

    class Arrays:
        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            image = np.asarray(pixels[offsets[i] : offsets[i + 1]]).reshape(shapes[i])
            return image, int(labels[i])

    mode = "jpg" if workload in JPEG_READS else "raw"
    # max_resolution=None: stored at the size given (the full-size workload keeps the source's size)
    image = RGBImageField(write_mode=mode, max_resolution=None, jpeg_quality=90)
    fields = {"image": image, "label": IntField()}
    DatasetWriter(beton, fields, num_workers=2).from_indexed_dataset(Arrays())


def child(args: argparse.Namespace) -> None:
    """Run one contender on one workload and print one JSON line."""
    paths = json.loads(args.paths)
    if args.child == "ffcv":
        build = ffcv_loader(args.workload, paths, args.workers, args.batch)
    elif args.child == "webdataset":
        build = wds_loader(args.workload, paths, args.workers, args.batch)
    else:
        build = imgpack_loader(args.child, args.workload, paths, args.workers, args.batch)
    shape: list = []

    def count(batch) -> int:
        if not shape:
            images, labels = batch
            shape.extend([list(images.shape), str(images.dtype), str(labels.dtype)])
        return count_images(batch)

    start = time.perf_counter()  # libraries imported: the clock covers opening, workers, JIT
    loader = build()
    set_epoch = getattr(getattr(loader, "dataset", None), "set_epoch", None)
    times = time_epochs(loader, args.epochs, set_epoch, warmup=0, started=start, count=count)
    result = {"first_batch_s": times.first_batch_s, "rates": times.rates, "images": times.images[-1]}
    print(json.dumps({**result, "shape": shape}))


# -- the parent: run children, sample their memory ---------------------------------------------
def run_child(python: str, name: str, workload: str, paths: dict, args: argparse.Namespace) -> dict:
    """One contender in a fresh process, the peak PSS of its process tree sampled from outside.

    Reading PSS walks page tables: sampled often, it steals CPU from multi-process loaders (one
    walk per process) far more than from FFCV's threads, hence ``--memory-interval``."""
    cmd = [python, __file__, "--child", name, "--workload", workload, "--paths", json.dumps(paths)]
    cmd += ["--epochs", str(args.epochs), "--workers", str(args.workers), "--batch", str(args.batch)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = run_measured(cmd, args.memory_interval, args.timeout, check=False, env=env)
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
    from readers.batch import BatchAssembler, _mirror, resize_into
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
    # child mode
    parser.add_argument("--child", default=None)
    parser.add_argument("--workload", default=None)
    parser.add_argument("--paths", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--beton", default=None)
    args = parser.parse_args()
    if args.child == "ffcv-write":
        ffcv_write(args.workload, args.data, args.beton)
        return
    if args.child:
        child(args)
        return

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
