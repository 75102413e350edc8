"""Batches decoded by NVIDIA DALI (on the GPU when there is one), with a CPU fallback behind one call.

    from readers.dali import dali_loader
    loader = dali_loader("train.lmdb", batch_size=256, resize=256, crop=224,
                         mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
    for epoch in range(90):
        loader.set_epoch(epoch)
        for images, labels in loader: ...

Three paths, one output (``loader.backend`` says which was taken; a one-line log notice too):

- ``dali-gpu``: DALI decodes with ``fn.decoders.image(device="mixed")`` (nvJPEG, and the
  hardware JPEG decoder where the GPU has one), resizes, crops and normalises on the GPU; the
  tensors are on the GPU.
- ``dali-cpu``: the same pipeline with ``device="cpu"`` (DALI installed, no GPU).
- ``dataloader``: no DALI. ``open_iterable`` with the same options, read through
  ``readers.make_loader``, then normalised (``readers.dali._fallback``): its pixels are
  ``open_iterable``'s, bit for bit (CPU tensors).

The options are one ``readers.spec.ReadSpec``, checked when ``dali_loader`` is called. The DALI
paths read the batches ``readers.dali._feed.BatchFeed`` plans (``readers.order.epoch_order`` for the order,
the rank split and the epochs; the format reader's ``read_many`` for the bytes), the same samples
in the same order as ``open_iterable``: labels and order are identical on all three paths, and
DALI's pixels differ from the CPU resampler's only by resampling (see docs/dali.md).

Geometry (``readers.image.geometry``, the same numbers as ``open_iterable``): ``resize=N`` scales the
shorter side to N (the other side rounded to nearest, ties to even), ``resize=(H, W)`` is exact;
``crop`` is a centre crop (N or (H, W), offsets rounded down) or a
``readers.RandomResizedCrop(size)``: a random window of the stored image per sample, resized to
``size``. ``flip=True`` (or a probability) mirrors images left-right. Windows and flips are a
function of (seed, epoch, sample index), so all three paths crop the same windows of the same
samples; DALI gets them through its ``external_source`` (``fn.decoders.image_slice`` decodes
only the window's region, ``fn.resize`` resizes it, ``fn.crop_mirror_normalize`` flips).
``mean``/``std`` are in pixel units (0-255, one value per channel) and make the output float32;
without them it is uint8. ``layout`` is ``CHW`` or ``HWC``.

Fields: ``fields=`` (with ``pad_fields``, ``min_visibility``, ``"geometry"``) gives
``(images, {"label": labels, name: ...})`` on every path, the targets of ``open_iterable``. DALI
moves no boxes: each sample's stored fields and the window and flip it was fed ride through the
pipeline as extra outputs, and this process moves the boxes with the batch path's code
(``readers.dali._fields``), so they equal the ``dataloader`` path's.

Last batch: ``drop_last=True`` leaves a short last batch out (and ranks split the dataset
without wrapping, as in ``open_iterable``); otherwise ``pad_last`` (default True) fills it by
wrapping around this rank's order so every batch has ``batch_size`` images, and
``pad_last=False`` yields it short. Ranks always get the same number of batches.

Where the bytes come from: the format reader of ``open_iterable``, opened with ``verify`` and
``reader_options``, in this process and in every worker. A tar dataset at an fsspec URL is read
through ``readers.remote.urls`` like everywhere else: ranged requests, or with
``reader_options={"cache_dir": ...}`` whole shards downloaded once into the local cache and
checked against the manifest's sha256 (what DALI's own tar reader, which needs local files,
cannot do).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from readers.batch.record_stream import field_plan
from readers.bucketing.bucket_plan import check_bucket_state
from readers.dali._buckets import bucketed
from readers.dali._fallback import FallbackLoader
from readers.dali._feed import PIXEL_ENCODINGS, BatchFeed
from readers.dali._fields import OUTPUTS as FIELD_OUTPUTS
from readers.dali._fields import DaliFields
from readers.dali._watch import named_failure, watched, worker_death
from readers.datasets.iterable import PackedIterable
from readers.errors import CallError, ImgpackError, OptionError
from readers.formats import open_reader
from readers.order.epoch_cursor import EpochCursor, dataset_identity
from readers.order.resume import Pass, ResumeError, ResumePoint
from readers.spec import ReadSpec

logger = logging.getLogger("imgpack.dali")
DEVICES = ("auto", "gpu", "cpu", "dataloader")
INSTALL_HINT = 'pip install "imgpack[dali]"'
_NOTICED: set[str] = set()


class DaliUnavailableError(ImgpackError):
    """The requested DALI path cannot run here (DALI not installed, or no GPU)."""


# -- choosing a path ----------------------------------------------------------------------------
def dali_available() -> bool:
    """True when ``nvidia.dali`` imports (a hidden or broken install counts as absent)."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception:  # ImportError, or a DALI build that cannot load its libraries
        return False
    return True


def gpu_available() -> bool:
    """A CUDA GPU torch can use (cheap: no CUDA context is created)."""
    return torch.cuda.is_available()


def select_path(device: str = "auto") -> str:
    """``dali-gpu``, ``dali-cpu`` or ``dataloader`` for the ``device`` asked for."""
    if device not in DEVICES:
        raise OptionError(f"device={device!r}; use one of {', '.join(DEVICES)}")
    if device == "dataloader":
        return "dataloader"
    has_dali = dali_available()
    if device == "auto":
        if not has_dali:
            return "dataloader"
        return "dali-gpu" if gpu_available() else "dali-cpu"
    if not has_dali:
        raise DaliUnavailableError(
            f"device={device!r} needs NVIDIA DALI, which is not installed; {INSTALL_HINT}, "
            "or pass device='auto' (or 'dataloader') to use the CPU DataLoader path"
        )
    if device == "gpu" and not gpu_available():
        raise DaliUnavailableError(
            "device='gpu' but torch sees no CUDA GPU here; pass device='cpu' for DALI on the CPU "
            "or device='auto' to choose by what is available"
        )
    return "dali-gpu" if device == "gpu" else "dali-cpu"


def _notice(path: str, why: str, level: int = logging.INFO) -> None:
    if path not in _NOTICED:
        _NOTICED.add(path)
        logger.log(level, "imgpack.dali: using the %s path (%s)", path, why)


def default_device_id() -> int:
    """This process's GPU: LOCAL_RANK when a launcher set it, else torch's current device.

    Does not create a CUDA context when torch has none yet (so DALI's python workers can fork).
    """
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


# -- the loader ---------------------------------------------------------------------------------
class DaliLoader(EpochCursor):
    """Iterates ``(images, labels)`` batches of one rank (``(images, target)`` with fields=); see above.

    Its epochs and resume follow ``open_iterable``'s rules, on the same code
    (``readers.order.epoch_cursor.EpochCursor``); it resumes at batch boundaries."""

    def __init__(
        self,
        feed: BatchFeed,
        backend: str,
        *,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        layout: str,
        num_threads: int,
        py_workers: int,
        device_id: int | None,
        prefetch: int,
        seed: int,
        fields: DaliFields | None = None,
    ):
        self.feed = feed
        self.order = feed.order
        self.fields = fields  # fields= : the targets of the carried fields (readers/dali/_fields.py)
        self.backend = backend  # dali-gpu, dali-cpu or dataloader
        self.mean, self.std = mean, std
        self.layout = layout
        self.num_threads = num_threads
        self.py_workers = py_workers
        self.device_id = device_id
        self.prefetch = prefetch
        self.seed = seed
        self.init_epochs()
        self._iterator: Any = None  # DALI iterator, rebuilt when the epoch sequence breaks
        self._pipeline_epoch = 0  # the epoch the DALI pipeline will produce next

    def __len__(self) -> int:
        """Batches this rank reads in the current epoch (what is left of it after a resume); with
        ``leftover="carry"`` a finished pass's epoch keeps its own length until the next begins."""
        resume = self._pending_resume()  # pending only for the epoch chosen: self.epoch
        return self.feed.batches_from(self.epoch, resume.position if resume is not None else 0)

    # -- resume (the rules of readers.order.resume, kept by readers.order.epoch_cursor) ----------------------
    def identity(self) -> dict[str, Any]:
        return {**dataset_identity(self.feed.reader.manifest), **self.feed.identity}

    def where(self) -> str:
        return str(self.feed.path)

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands (batches handed out so far), to save with a checkpoint."""
        return self._state(self._point_here())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``: the next iteration yields the rest of that epoch."""
        check_bucket_state(state, self.feed.identity, self.where())
        point = self._checked_point(state)
        if point.offset:
            raise ResumeError("the DALI loader resumes at batch boundaries; this state is mid-batch")
        self._resume_at(point)
        self._iterator = None  # the pipeline is rebuilt for the resumed epoch

    @property
    def reader(self):
        """The format reader of this process (``FallbackLoader.reader`` too)."""
        return self.feed.reader

    @property
    def classes(self) -> list[str]:
        return list(self.feed.reader.manifest.classes)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, Any]]:
        epoch = self.begin_pass()
        start = self.pass_start(epoch)
        self._resume = None  # used up by this pass
        self._pass = current = Pass(epoch, start, 0, 1)
        self._start_feed(start)
        remaining = self.order.at_epoch(epoch).samples_from(start.position)  # carry: that epoch's length
        for batch in self._iter_dali():
            current.samples = min(current.samples + self.feed.batch_size, remaining)  # padding: not samples
            yield batch

    def _start_feed(self, start: ResumePoint) -> None:
        """The feed starts its epoch at ``start``; a pipeline fed from elsewhere is rebuilt (its
        workers hold copies of the feed)."""
        resume = (start.epoch, start.position) if start.position else None
        if resume != self.feed.resume:
            self.feed.resume = resume
            self.feed._positions = None
            self._iterator = None

    # -- DALI paths ---------------------------------------------------------------------------
    def _iter_dali(self) -> Iterator[tuple[torch.Tensor, Any]]:
        if self._iterator is None or self._pipeline_epoch != self.epoch:
            self._build(self.epoch)
        done = False
        batch = 0
        try:
            try:
                for out in watched(self._iterator, self.py_workers, self.feed.path):
                    yield self._batch(out[0])
                    batch += 1
            except RuntimeError as exc:  # a py_workers process died, or DALI's decoder failed
                death = worker_death(self._iterator, self.feed.path)
                raise (death or named_failure(self.feed, self.epoch, exc, batch, self.prefetch)) from None
            done = True
            self._pipeline_epoch = self.epoch + 1
        finally:
            if not done:  # abandoned mid-epoch: the pipeline cannot rewind, start afresh next time
                self._iterator = None

    def _batch(self, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """(images, labels), or with ``fields=`` (images, {"label": labels, name: ...})."""
        if self.fields is None:
            return out["images"], out["labels"]
        carried = (out[name] for name in FIELD_OUTPUTS)
        return out["images"], self.fields.target(out["labels"], *carried)

    def _build(self, epoch: int) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        from readers.dali._pipeline import build_pipeline

        self.feed.base_epoch = epoch
        gpu = self.backend == "dali-gpu"
        if self.py_workers:
            # Building forks the py_workers processes. A pipeline dropped earlier but not yet
            # collected (DALI's objects form cycles) would be collected in such a process, and its
            # Pipeline.__del__ would shut the parent's pipeline down there: a segfault (seen in CI,
            # in a worker's first allocations). Collected here, by the process that owns it.
            self._iterator = None
            gc.collect()
        pipe = build_pipeline(
            self.feed,
            gpu=gpu,
            num_threads=self.num_threads,
            device_id=self.device_id if gpu else None,
            py_workers=self.py_workers,
            prefetch=self.prefetch,
            seed=self.seed,
            mean=self.mean,
            std=self.std,
            layout=self.layout,
        )
        names = ["images", "labels", *(FIELD_OUTPUTS if self.fields is not None else ())]
        self._iterator = DALIGenericIterator(pipe, names, auto_reset=True, prepare_first_batch=False)
        self._pipeline_epoch = epoch


def check_channels(manifest: Any, mean: Sequence[float] | None, std: Sequence[float] | None) -> None:
    """``mean``/``std``: one value per channel of the stored images."""
    channels = 1 if manifest.preprocess.get("mode") == "L" else 3
    for name, values in (("mean", mean), ("std", std)):
        if values is not None and len(values) != channels:
            raise OptionError(f"{name} needs {channels} value(s), one per channel, got {len(values)}")


def dali_loader(
    path: str | os.PathLike,
    *,
    batch_size: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str = "auto",
    pad_last: bool | None = None,
    num_threads: int | None = None,
    num_workers: int | None = None,
    py_workers: int = 0,
    device_id: int | None = None,
    prefetch: int = 2,
    spec: ReadSpec | None = None,
    **options: Any,
) -> DaliLoader | FallbackLoader:
    """A loader of ``(images, labels)`` batches for the packed dataset at ``path`` (with
    ``fields=``: ``(images, {"label": labels, name: ...})``).

    The reading options (shuffle, seed, resize, crop, flip, layout, rank, world_size, drop_last,
    block_size, buffer_size, fields, pad_fields, min_visibility, verify, reader_options, storage
    options) are ``readers.spec.ReadSpec``'s, checked as for ``open_iterable``. ``pad_last``
    defaults to True here (unless ``drop_last``).
    ``device``: ``auto`` (DALI on the GPU if there is one, DALI on the CPU if not, the CPU
    DataLoader without DALI), or ``gpu`` / ``cpu`` (DALI, an error if it cannot run) or
    ``dataloader``. ``num_threads``: DALI's CPU threads. ``num_workers``: DataLoader workers of
    the fallback. ``py_workers``: processes running DALI's parallel external_source (0 reads in
    the calling process, which is enough for local LMDB/HDF5; raise it for slow storage).
    """
    if spec is None:
        if pad_last is None:
            pad_last = not options.get("drop_last", False)
        spec = ReadSpec.build("dali_loader", {**options, "batch_size": batch_size, "pad_last": pad_last})
    elif options:
        raise CallError("pass either spec= or the reading options, not both")
    if (mean is None) != (std is None):
        raise OptionError("pass mean and std together (pixel units, one value per channel)")
    chosen = select_path(device)
    if chosen == "dataloader" and device == "auto":
        _notice(chosen, f"NVIDIA DALI is not installed; {INSTALL_HINT} for GPU decoding", logging.WARNING)
    else:
        _notice(chosen, f"device={device!r}")
    cpus = os.cpu_count() or 1
    if chosen == "dataloader":  # open_iterable's stream, its geometry made (and checked) there
        workers = min(4, cpus) if num_workers is None else num_workers
        stream = PackedIterable(path, spec=spec)
        check_channels(stream.reader.manifest, mean, std)
        return FallbackLoader(stream, mean=mean, std=std, num_workers=workers, pin_memory=gpu_available())
    reader = open_reader(path, **spec.open_options)
    geometry = spec.geometry([(str(path), reader.manifest.stored_sizes)])  # the feed's and the fields'
    check_channels(reader.manifest, mean, std)
    assert spec.batch_size is not None
    fields = None
    plan = field_plan(spec, [reader.manifest.fields], str(path))
    if plan is not None:
        fields = DaliFields(plan, geometry, reader.manifest.fields)
    last_batch = "drop" if spec.drop_last else ("pad" if spec.pad_last else "partial")
    order = spec.order_of(len(reader), unit=spec.batch_size)
    feed = BatchFeed(
        path,
        order,
        spec.batch_size,
        last_batch,
        reader_options=spec.open_options,
        fields=fields.schema if fields is not None else None,
        geometry=geometry,
    )
    feed._reader = reader  # this process's reader (workers open their own)
    if spec.buckets is not None:  # one bucket per batch, each sample resized to it in DALI
        feed = bucketed(feed, spec)  # the fields follow the same geometry
    if chosen == "dali-gpu" and device_id is None:
        device_id = default_device_id()
    return DaliLoader(
        feed,
        chosen,
        mean=mean,
        std=std,
        layout=spec.layout,
        num_threads=num_threads or min(4, cpus),
        py_workers=py_workers,
        device_id=device_id,
        prefetch=prefetch,
        seed=spec.seed,
        fields=fields,
    )


__all__ = [
    "DaliLoader",
    "DaliUnavailableError",
    "FallbackLoader",
    "PIXEL_ENCODINGS",
    "dali_loader",
    "select_path",
]
