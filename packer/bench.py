"""Measuring how fast packed datasets (and a plain image folder) load in PyTorch.

Every (dataset, worker count) runs in a fresh spawned process, so its peak memory, its start-up
time and its page-cache and handle state do not leak into the next measurement. In that process:
open the dataset and a DataLoader, read a warm-up epoch (its first batch gives the time to first
batch), then ``epochs`` timed epochs, while a thread samples the memory of the process tree (the
measuring process and its DataLoader workers). Random access (map-style ``dataset[i]`` for a
random sample of indices) is measured once per dataset, after the epochs.

Read paths, named in every result:
- ``batch``: ``open_iterable(batch_size=B)`` with ``DataLoader(batch_size=None)``; workers
  assemble whole batches (packed data whose images all have one size, decode=tensor);
- ``sample+stack``: per-sample items collated by the DataLoader into one stacked tensor;
- ``sample+list``: per-sample items, a batch is a list (images of different sizes, or bytes/PIL);
- ``dali``: ``readers.dali.dali_loader``.

The baseline is what a torchvision user without packing runs: a map-style dataset over the
image folder that opens each file with Pillow, converts it, resizes and centre-crops it to the
packed data's output (the first dataset's manifest ``preprocess``) on the fly.

``augment="rrc"`` measures the training workload instead: every contender (the baseline on the
original files included) reads ``RandomResizedCrop(augment_size)`` + a horizontal flip (p=0.5).
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.bench_baseline import ImageFolderBaseline, collate_list
from packer.preprocess import PreprocessSpec
from packer.source import scan_folder
from readers.errors import ImgpackError
from readers.manifest import read_manifest

BASELINE_NAME = "imagefolder+pillow"
AUGMENTS = ("none", "rrc")
READ_PATHS = {
    "batch": "workers assemble whole batches (open_iterable batch_size=B, DataLoader batch_size=None)",
    "sample+stack": "per-sample items, stacked into a batch tensor by the DataLoader's collate",
    "sample+list": "per-sample items (different sizes, bytes or PIL), a batch is a list",
    "dali": "readers.dali.dali_loader (the workers column is its num_threads, at least 1)",
}


class BenchError(ImgpackError):
    """A benchmark cannot run as asked (missing module, mismatched datasets, a failed run)."""


@dataclass(frozen=True)
class Settings:
    workers: tuple[int, ...] = (0, 2)
    batch_size: int = 64
    epochs: int = 2
    decode: str = "tensor"
    random_reads: int = 256
    seed: int = 0
    augment: str = "none"  # none | rrc (RandomResizedCrop(augment_size) + flip, the training read)
    augment_size: int = 224

    def __post_init__(self) -> None:
        if not self.workers or min(self.workers) < 0:
            raise ValueError(f"workers={self.workers}: give one or more counts >= 0, e.g. 0,2,4")
        if self.batch_size < 1 or self.epochs < 1 or self.random_reads < 0:
            raise ValueError("batch size and epochs must be >= 1 and random reads >= 0")
        if self.decode not in ("pil", "numpy", "tensor", "bytes"):
            raise ValueError(f"decode={self.decode!r}; use pil, numpy, tensor or bytes")
        if self.augment not in AUGMENTS:
            raise ValueError(f"augment={self.augment!r}; use one of {', '.join(AUGMENTS)}")
        if self.augment != "none" and self.decode == "bytes":
            raise ValueError("augment=rrc needs decoded images; use decode=tensor, numpy or pil")

    def read_options(self) -> dict[str, Any]:
        """``crop=``/``flip=`` for the readers: the training augmentation, or nothing."""
        if self.augment == "none":
            return {}
        from readers.geometry import RandomResizedCrop

        return {"crop": RandomResizedCrop(self.augment_size), "flip": True}


@dataclass(frozen=True)
class Target:
    """One thing to read: a packed dataset, the image-folder baseline, or a packed dataset via DALI."""

    name: str
    kind: str  # packed | baseline | dali
    path: str
    preprocess: dict[str, Any] | None = None  # baseline only: the resize/crop to apply on the fly


@dataclass
class DatasetInfo:
    name: str
    kind: str
    format: str
    path: str
    encoding: str
    num_samples: int
    disk_bytes: int
    bytes_per_image: float
    read_path: str
    output_size: list[int] | None  # [height, width] when every image has it
    random_access: dict[str, Any] | None = None


@dataclass
class Run:
    """One (dataset, worker count) measurement."""

    name: str
    kind: str
    workers: int
    read_path: str
    batch_size: int
    epochs: int
    samples_per_epoch: int
    images: int  # read in the timed epochs
    epoch_seconds: list[float]
    images_per_s: float  # median over the timed epochs
    images_per_s_min: float
    images_per_s_max: float
    mb_per_s: float  # stored megabytes consumed per second (median epoch)
    first_batch_s: float  # from opening the dataset to the first batch of the warm-up epoch
    peak_rss_bytes: int  # sum over the process tree (shared pages counted once per process)
    peak_pss_bytes: int | None  # proportional set size: shared pages split between processes
    idle_rss_bytes: int  # the measuring process before opening the dataset (python + torch)


@dataclass
class BenchReport:
    settings: Settings
    datasets: list[DatasetInfo]
    runs: list[Run]
    baseline_preprocess: dict[str, Any] | None
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "settings": asdict(self.settings),
            "read_paths": READ_PATHS,
            "baseline_preprocess": self.baseline_preprocess,
            "datasets": [asdict(d) for d in self.datasets],
            "runs": [asdict(r) for r in self.runs],
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        """A report read back from ``to_dict`` output (a ``--json`` file), e.g. to plot it again."""
        settings = dict(data["settings"], workers=tuple(data["settings"]["workers"]))
        return cls(
            Settings(**settings),
            [DatasetInfo(**d) for d in data["datasets"]],
            [Run(**r) for r in data["runs"]],
            data.get("baseline_preprocess"),
            data.get("machine", {}),
            data.get("notes", []),
        )

    def run(self, name: str, workers: int) -> Run | None:
        return next((r for r in self.runs if r.name == name and r.workers == workers), None)


# -- helpers ------------------------------------------------------------------------------------
def folder_bytes(path: str | os.PathLike) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def fixed_size(preprocess: dict[str, Any] | None) -> tuple[int, int] | None:
    if not preprocess or preprocess.get("encode") == "original":
        return None
    return PreprocessSpec.from_dict(preprocess).fixed_size


class MemorySampler:
    """Peak memory of this process and all its children, sampled by a background thread."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._psutil = psutil
        self.process = psutil.Process()
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss: int | None = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        rss = pss = 0
        procs = [self.process]
        try:
            procs += self.process.children(recursive=True)
        except self._psutil.Error:
            pass
        for proc in procs:
            try:
                if self.peak_pss is not None:
                    info = proc.memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", 0)
                else:
                    rss += proc.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.ZombieProcess):
                continue
            except self._psutil.AccessDenied:
                self.peak_pss = None  # no smaps access: RSS only
        self.peak_rss = max(self.peak_rss, rss)
        if self.peak_pss is not None:
            self.peak_pss = max(self.peak_pss, pss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# -- one measurement (runs inside a fresh process) ---------------------------------------------
def describe(target: Target, settings: Settings) -> DatasetInfo:
    """Size on disk, sample count and the read path a target will use."""
    if target.kind == "baseline":
        scan = scan_folder(target.path)
        disk = sum(os.stat(item.path).st_size for item in scan.items)
        n = len(scan.items)
        size = fixed_size(target.preprocess) if settings.augment == "none" else (settings.augment_size,) * 2
        read_path = "sample+stack" if size and settings.decode in ("tensor", "numpy") else "sample+list"
        fmt, encoding = "imagefolder", "original"
    else:
        manifest = read_manifest(target.path)
        disk = folder_bytes(target.path)
        n = manifest.num_samples
        size = fixed_size(manifest.preprocess) if settings.augment == "none" else (settings.augment_size,) * 2
        fmt, encoding = manifest.format, manifest.encoding
        if target.kind == "dali":
            read_path = "dali"
        elif size and settings.decode == "tensor":
            read_path = "batch"
        else:
            read_path = "sample+stack" if size and settings.decode == "numpy" else "sample+list"
    return DatasetInfo(
        name=target.name,
        kind=target.kind,
        format=fmt,
        path=str(target.path),
        encoding=encoding,
        num_samples=n,
        disk_bytes=disk,
        bytes_per_image=disk / max(1, n),
        read_path=read_path,
        output_size=list(size) if size else None,
    )


def _dali_module() -> Any:
    try:
        module = importlib.import_module("readers.dali")
    except ModuleNotFoundError as exc:
        if exc.name not in ("readers.dali", "readers"):
            raise
        module = None
    if module is None or not hasattr(module, "dali_loader"):
        raise BenchError(
            "--dali needs readers.dali.dali_loader (the DALI reader), which this imgpack install "
            "does not have; update imgpack or drop --dali"
        )
    return module


def _open_loader(target: Target, info: DatasetInfo, workers: int, settings: Settings) -> tuple[Any, Any]:
    """(loader, set_epoch) for one target."""
    from torch.utils.data import DataLoader

    extra = {"persistent_workers": True} if workers > 0 else {}
    if target.kind == "dali":
        loader_fn = _dali_module().dali_loader
        kwargs: dict[str, Any] = {"shuffle": True, "seed": settings.seed, **settings.read_options()}
        if "num_threads" in inspect.signature(loader_fn).parameters:
            kwargs["num_threads"] = max(1, workers)
        loader = loader_fn(target.path, settings.batch_size, **kwargs)
        return loader, getattr(loader, "set_epoch", lambda epoch: None)
    if target.kind == "baseline":
        from readers.dataset import DeterministicSampler

        dataset = ImageFolderBaseline(
            target.path, target.preprocess, settings.decode, **settings.read_options()
        )
        sampler = DeterministicSampler(len(dataset), shuffle=True, seed=settings.seed)
        collate = None if info.read_path == "sample+stack" else collate_list
        loader = DataLoader(
            dataset,
            batch_size=settings.batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=collate,
            **extra,
        )
        return loader, sampler.set_epoch
    from readers.iterable import open_iterable

    if info.read_path == "batch":
        it = open_iterable(
            target.path,
            shuffle=True,
            seed=settings.seed,
            batch_size=settings.batch_size,
            **settings.read_options(),
        )
        loader = DataLoader(it, batch_size=None, num_workers=workers, **extra)
    else:
        it = open_iterable(
            target.path, shuffle=True, seed=settings.seed, decode=settings.decode, **settings.read_options()
        )
        collate = None if info.read_path == "sample+stack" else collate_list
        loader = DataLoader(
            it, batch_size=settings.batch_size, num_workers=workers, collate_fn=collate, **extra
        )
    return loader, it.set_epoch


def _count(batch: Any) -> int:
    labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else batch
    return len(labels)


def measure_loader(target: Target, workers: int, settings: Settings) -> Run:
    """Warm-up epoch, then timed epochs, for one target and worker count (in this process)."""
    info = describe(target, settings)
    sampler = MemorySampler()
    idle_rss = sampler.process.memory_info().rss
    seconds: list[float] = []
    counts: list[int] = []
    with sampler:
        opened = time.perf_counter()
        loader, set_epoch = _open_loader(target, info, workers, settings)
        first_batch = None
        for epoch in range(settings.epochs + 1):
            set_epoch(epoch)
            count = 0
            start = time.perf_counter()
            for batch in loader:
                if first_batch is None:
                    first_batch = time.perf_counter() - opened
                count += _count(batch)
            elapsed = time.perf_counter() - start
            if epoch > 0:  # epoch 0 is the warm-up
                seconds.append(elapsed)
                counts.append(count)
        del loader  # stop persistent workers while the sampler still watches
    rates = [c / s if s > 0 else 0.0 for c, s in zip(counts, seconds)]
    median = statistics.median(rates)
    return Run(
        name=target.name,
        kind=target.kind,
        workers=workers,
        read_path=info.read_path,
        batch_size=settings.batch_size,
        epochs=settings.epochs,
        samples_per_epoch=info.num_samples,
        images=sum(counts),
        epoch_seconds=seconds,
        images_per_s=median,
        images_per_s_min=min(rates),
        images_per_s_max=max(rates),
        mb_per_s=median * info.bytes_per_image / 1e6,
        first_batch_s=first_batch if first_batch is not None else float("nan"),
        peak_rss_bytes=sampler.peak_rss,
        peak_pss_bytes=sampler.peak_pss or None,
        idle_rss_bytes=idle_rss,
    )


def _reads_per_second(dataset: Any, indices: list[int]) -> float:
    dataset[indices[-1]]  # open handles untimed
    start = time.perf_counter()
    for i in indices:
        dataset[i]
    elapsed = time.perf_counter() - start
    return len(indices) / elapsed if elapsed > 0 else 0.0


def measure_random_access(target: Target, settings: Settings) -> dict[str, Any] | None:
    """Map-style reads per second at random indices: raw bytes, and decoded."""
    if target.kind == "dali" or settings.random_reads == 0:
        return None
    decoded = settings.decode if settings.decode != "bytes" else "numpy"
    if target.kind == "baseline":

        def make(kind: str) -> Any:
            return ImageFolderBaseline(target.path, target.preprocess, kind)
    else:
        from readers.dataset import open_dataset

        def make(kind: str) -> Any:
            return open_dataset(target.path, decode=kind)

    n = len(make("bytes"))
    rng = np.random.default_rng(settings.seed)
    indices = rng.choice(n, size=min(n, settings.random_reads), replace=False).tolist()
    return {
        "reads": len(indices),
        "bytes_per_s": _reads_per_second(make("bytes"), indices),
        "decoded_per_s": _reads_per_second(make(decoded), indices),
        "decoded_kind": decoded,
    }


def _child(
    conn: Any, target: Target, workers: int, settings: Settings, random_access: bool, start_method: str
) -> None:
    # A spawned process defaults to spawning its own children; DataLoader workers should start
    # the way they would in the user's training script (the parent's default: fork on Linux).
    multiprocessing.set_start_method(start_method, force=True)
    try:
        run = measure_loader(target, workers, settings)
        access = measure_random_access(target, settings) if random_access else None
        conn.send(("ok", run, access))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", None))
    finally:
        conn.close()


def measure_isolated(
    target: Target, workers: int, settings: Settings, random_access: bool = False
) -> tuple[Run, dict[str, Any] | None]:
    """``measure_loader`` (and optionally ``measure_random_access``) in a fresh spawned process."""
    start_method = multiprocessing.get_start_method()
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, target, workers, settings, random_access, start_method))
    proc.start()
    send.close()
    try:
        message = receive.recv()
    except EOFError:
        proc.join()
        message = ("error", f"the measuring process died (exit code {proc.exitcode})", None)
    finally:
        proc.join()
        receive.close()
    status, payload, access = message
    if status != "ok":
        raise BenchError(f"{target.path}: {target.name} with {workers} worker(s) failed: {payload}")
    return payload, access


# -- the whole benchmark ------------------------------------------------------------------------
def _unique_names(paths: list[str]) -> list[str]:
    names: list[str] = []
    for path in paths:
        fmt = read_manifest(path).format
        base = Path(path).name or str(path)
        name = f"{fmt}:{base}"
        if name in names:
            name = f"{name}#{len(names)}"
        names.append(name)
    return names


def machine_info() -> dict[str, Any]:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def plan_targets(
    datasets: list[str], baseline: str | None, dali: bool
) -> tuple[list[Target], dict[str, Any] | None, list[str]]:
    """The targets to measure, the preprocess the baseline mirrors, and notes for the report."""
    if not datasets:
        raise BenchError("give at least one packed dataset to benchmark")
    notes: list[str] = []
    manifests = [read_manifest(path) for path in datasets]  # refuses non-datasets clearly
    names = _unique_names(datasets)
    targets = [Target(name, "packed", str(path)) for name, path in zip(names, datasets)]
    if dali:
        _dali_module()
        targets += [Target(f"dali:{n.split(':', 1)[1]}", "dali", str(p)) for n, p in zip(names, datasets)]
    preprocess = manifests[0].preprocess or None
    if baseline is not None:
        others = [
            str(p)
            for p, m in zip(datasets[1:], manifests[1:])
            if fixed_size(m.preprocess) != fixed_size(preprocess)
        ]
        if others:
            notes.append(
                f"the baseline resizes like {datasets[0]}; {', '.join(others)} store a different output size"
            )
        targets.insert(0, Target(BASELINE_NAME, "baseline", str(baseline), preprocess))
    return targets, (preprocess if baseline is not None else None), notes


def run_bench(
    datasets: list[str],
    baseline: str | None = None,
    settings: Settings | None = None,
    dali: bool = False,
    log: Callable[[str], None] | None = None,
) -> BenchReport:
    """Measure every dataset (and the baseline) at every worker count; see the module docstring."""
    settings = settings or Settings()
    log = log or (lambda message: None)
    targets, preprocess, notes = plan_targets([str(d) for d in datasets], baseline, dali)
    report = BenchReport(settings, [], [], preprocess, machine_info(), notes)
    for target in targets:
        info = describe(target, settings)
        report.datasets.append(info)
        for position, workers in enumerate(settings.workers):
            log(f"{target.name}: {workers} worker(s), {info.read_path} path ...")
            run, access = measure_isolated(target, workers, settings, random_access=position == 0)
            if access is not None:
                info.random_access = access
            report.runs.append(run)
            log(
                f"{target.name}: {workers} worker(s): {run.images_per_s:,.0f} img/s, "
                f"first batch {run.first_batch_s:.2f} s"
            )
    counts = {info.name: info.num_samples for info in report.datasets}
    if len(set(counts.values())) > 1:
        report.notes.append(f"datasets hold different numbers of samples: {counts}")
    return report


__all__ = [
    "BASELINE_NAME",
    "BenchError",
    "BenchReport",
    "DatasetInfo",
    "ImageFolderBaseline",
    "MemorySampler",
    "Run",
    "Settings",
    "Target",
    "collate_list",
    "measure_isolated",
    "measure_loader",
    "measure_random_access",
    "run_bench",
]
