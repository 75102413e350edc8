"""Measuring how fast packed datasets (and a plain image folder) load in PyTorch: ``pack bench``.

Every (dataset, worker count) runs in a fresh spawned process (``harness.run_isolated``), so its
peak memory, its start-up time and its page-cache and handle state do not leak into the next
measurement. In that process: open the dataset and a DataLoader, read a warm-up epoch (its first
batch gives the time to first batch), then ``epochs`` timed epochs, while a thread samples the
memory of the process tree (the measuring process and its DataLoader workers). Random access
(map-style ``dataset[i]`` for a random sample of indices) is measured once per dataset, after
the epochs. The contenders and their read paths: ``packer.bench.contenders``.

``augment="rrc"`` measures the training workload instead: every contender (the baseline on the
original files included) reads ``RandomResizedCrop(augment_size)`` + a horizontal flip (p=0.5).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.bench.contenders import dali_module, describe, fixed_size, measure_random_access, open_loader
from packer.bench.harness import BenchError, MemorySampler, machine_info, run_isolated, time_epochs
from packer.bench.model import BASELINE_NAME, BenchReport, Run, Settings, Target
from readers.image import jpegwindow
from readers.store.manifest import read_manifest


def measure_loader(target: Target, workers: int, settings: Settings) -> Run:
    """Warm-up epoch, then timed epochs, for one target and worker count (in this process)."""
    info = describe(target, settings)
    sampler = MemorySampler()
    idle_rss = sampler.process.memory_info().rss
    with sampler:
        opened = time.perf_counter()
        loader, set_epoch = open_loader(target, info, workers, settings)
        times = time_epochs(loader, settings.epochs, set_epoch, started=opened)
        del loader  # stop persistent workers while the sampler still watches
    rates = times.rates
    median = statistics.median(rates)
    return Run(
        name=target.name,
        kind=target.kind,
        workers=workers,
        read_path=info.read_path,
        batch_size=settings.batch_size,
        epochs=settings.epochs,
        samples_per_epoch=info.num_samples,
        images=sum(times.images[times.warmup :]),
        epoch_seconds=times.seconds[times.warmup :],
        images_per_s=median,
        images_per_s_min=min(rates),
        images_per_s_max=max(rates),
        mb_per_s=median * info.bytes_per_image / 1e6,
        first_batch_s=times.first_batch_s,
        peak_rss_bytes=sampler.peak_rss,
        peak_pss_bytes=sampler.peak_pss or None,
        idle_rss_bytes=idle_rss,
    )


def _measure(
    target: Target, workers: int, settings: Settings, random_access: bool
) -> tuple[Run, dict[str, Any] | None]:
    run = measure_loader(target, workers, settings)
    return run, measure_random_access(target, settings) if random_access else None


def measure_isolated(
    target: Target, workers: int, settings: Settings, random_access: bool = False
) -> tuple[Run, dict[str, Any] | None]:
    """``measure_loader`` (and optionally ``measure_random_access``) in a fresh spawned process."""
    try:
        env = {} if target.window_decode else {"IMGPACK_JPEG_WINDOW": "0"}
        return run_isolated(_measure, target, workers, settings, random_access, env=env)
    except BenchError as exc:
        raise BenchError(f"{target.path}: {target.name} with {workers} worker(s) failed: {exc}") from None


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
        dali_module()
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
        skip = tuple(entry["path"] for entry in manifests[0].skipped if "path" in entry)
        if skip:
            first = manifests[0].skipped[0]
            notes.append(
                f"the baseline skips the {len(skip)} file(s) that packing {datasets[0]} skipped "
                f"(first: {first.get('path')}: {first.get('reason')})"
            )
        targets.insert(0, Target(BASELINE_NAME, "baseline", str(baseline), preprocess, skip))
    return targets, (preprocess if baseline is not None else None), notes


def whole_decode_targets(targets: list[Target]) -> list[Target]:
    """For the training read: each packed JPEG dataset once more, its JPEGs decoded whole before
    the crop, so the report shows what decoding only the window gains (none without the decoder)."""
    if jpegwindow.DECODER is None:
        return []
    return [
        Target(f"{t.name} (whole decode)", t.kind, t.path, window_decode=False)
        for t in targets
        if t.kind == "packed" and read_manifest(t.path).encoding == "jpeg"
    ]


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
    if settings.augment == "rrc":
        targets += whole_decode_targets(targets)
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
