"""The contenders: what ``pack bench`` and the suites read, and how.

- ``batch_path``: workers assemble whole batches (packed data whose images all have one size);
- ``sample_path``: per-sample items batched by the DataLoader (stacked, or a list);
- ``baseline_path``: the image folder read like torchvision's ImageFolder (``baseline.py``), which
  resizes and centre-crops on the fly to the packed data's output (the first dataset's manifest
  ``preprocess``), or does the training read (``RandomResizedCrop`` + flip) on the originals;
- DALI: ``readers.dali.dali_loader``.

``describe`` picks the read path each target gets (named in every result, ``model.READ_PATHS``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from packer.bench.baseline import ImageFolderBaseline, collate_list
from packer.bench.harness import BenchError, folder_bytes
from packer.bench.model import DatasetInfo, Settings, Target
from packer.info.order_info import read_quality
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import read_manifest


def fixed_size(preprocess: dict[str, Any] | None) -> tuple[int, int] | None:
    if not preprocess or preprocess.get("encode") == "original":
        return None
    return PreprocessSpec.from_dict(preprocess).fixed_size


def describe(target: Target, settings: Settings) -> DatasetInfo:
    """Size on disk, sample count and the read path a target will use."""
    quality = None
    if target.kind == "baseline":
        samples = ImageFolderBaseline(target.path, skip=target.skip).samples
        disk = sum(os.stat(path).st_size for path, _ in samples)
        n = len(samples)
        size = fixed_size(target.preprocess) if settings.augment == "none" else (settings.augment_size,) * 2
        read_path = "sample+stack" if size and settings.decode in ("tensor", "numpy") else "sample+list"
        fmt, encoding = "imagefolder", "original"
    else:
        manifest = read_manifest(target.path)
        quality = read_quality(str(target.path), settings.batch_size)
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
        read_quality=quality.to_dict() if target.kind != "baseline" and quality else None,
    )


def dali_module() -> Any:
    """``readers.dali`` with its ``dali_loader``, or a ``BenchError`` saying how to do without."""
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


Loader = tuple[Any, Callable[[int], None]]  # (loader, set_epoch)


def _persistent(workers: int) -> dict[str, Any]:
    return {"persistent_workers": True} if workers > 0 else {}


def batch_path(path: str | os.PathLike, batch_size: int, workers: int, **read_options: Any) -> Loader:
    """The batch path: ``open_iterable(batch_size=B)``, workers assemble whole batches, the
    DataLoader passes them on (``batch_size=None``, ``make_loader``'s ``prefetch_factor``)."""
    from torch.utils.data import DataLoader

    from readers.datasets.iterable import open_iterable
    from readers.datasets.loader import WHOLE_BATCH_PREFETCH

    it = open_iterable(path, batch_size=batch_size, **read_options)
    options = {**_persistent(workers), "prefetch_factor": WHOLE_BATCH_PREFETCH} if workers else {}
    return DataLoader(it, batch_size=None, num_workers=workers, **options), it.set_epoch


def sample_path(
    path: str | os.PathLike, batch_size: int, workers: int, collate: Any = None, **read_options: Any
) -> Loader:
    """The per-sample path: ``open_iterable`` items batched by the DataLoader (``collate``:
    None stacks them, ``collate_list`` keeps a list)."""
    from torch.utils.data import DataLoader

    from readers.datasets.iterable import open_iterable

    it = open_iterable(path, **read_options)
    loader = DataLoader(
        it, batch_size=batch_size, num_workers=workers, collate_fn=collate, **_persistent(workers)
    )
    return loader, it.set_epoch


def baseline_path(
    root: str | os.PathLike,
    preprocess: dict[str, Any] | None,
    decode: str,
    batch_size: int,
    workers: int,
    seed: int = 0,
    collate: Any = None,
    **augment: Any,
) -> Loader:
    """The image folder read like torchvision's ImageFolder, shuffled in imgpack's order."""
    from torch.utils.data import DataLoader

    from readers.datasets.dataset import DeterministicSampler

    dataset = ImageFolderBaseline(root, preprocess, decode, **augment)
    sampler = DeterministicSampler(len(dataset), shuffle=True, seed=seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        **_persistent(workers),
    )
    return loader, sampler.set_epoch


def open_loader(target: Target, info: DatasetInfo, workers: int, settings: Settings) -> Loader:
    """(loader, set_epoch) for one target, on the read path ``info`` names."""
    if target.kind == "dali":
        loader_fn = dali_module().dali_loader
        kwargs: dict[str, Any] = {"shuffle": True, "seed": settings.seed, **settings.read_options()}
        if "num_threads" in inspect.signature(loader_fn).parameters:
            kwargs["num_threads"] = max(1, workers)
        loader = loader_fn(target.path, batch_size=settings.batch_size, **kwargs)
        return loader, getattr(loader, "set_epoch", lambda epoch: None)
    collate = None if info.read_path == "sample+stack" else collate_list
    batch, options = settings.batch_size, settings.read_options()
    if target.kind == "baseline":
        pre, decode, seed = target.preprocess, settings.decode, settings.seed
        options["skip"] = target.skip
        return baseline_path(target.path, pre, decode, batch, workers, seed, collate, **options)
    options.update(shuffle=True, seed=settings.seed)
    if info.read_path == "batch":
        return batch_path(target.path, batch, workers, **options)
    return sample_path(target.path, batch, workers, collate, decode=settings.decode, **options)


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
            return ImageFolderBaseline(target.path, target.preprocess, kind, skip=target.skip)
    else:
        from readers.datasets.dataset import open_dataset

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
