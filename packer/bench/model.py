"""What a benchmark measures and reports: its settings, its targets, one run, the whole report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from readers.errors import OptionError

BASELINE_NAME = "imagefolder+pillow"
AUGMENTS = ("none", "rrc")
READ_PATHS = {
    "batch": "workers assemble whole batches (open_iterable batch_size=B, DataLoader batch_size=None)",
    "sample+stack": "per-sample items, stacked into a batch tensor by the DataLoader's collate",
    "sample+list": "per-sample items (different sizes, bytes or PIL), a batch is a list",
    "dali": "readers.dali.dali_loader (the workers column is its num_threads, at least 1)",
}


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
            raise OptionError(f"workers={self.workers}: give one or more counts >= 0, e.g. 0,2,4")
        if self.batch_size < 1 or self.epochs < 1 or self.random_reads < 0:
            raise OptionError("batch size and epochs must be >= 1 and random reads >= 0")
        if self.decode not in ("pil", "numpy", "tensor", "bytes"):
            raise OptionError(f"decode={self.decode!r}; use pil, numpy, tensor or bytes")
        if self.augment not in AUGMENTS:
            raise OptionError(f"augment={self.augment!r}; use one of {', '.join(AUGMENTS)}")
        if self.augment != "none" and self.decode == "bytes":
            raise OptionError("augment=rrc needs decoded images; use decode=tensor, numpy or pil")

    def read_options(self) -> dict[str, Any]:
        """``crop=``/``flip=`` for the readers: the training augmentation, or nothing."""
        if self.augment == "none":
            return {}
        from readers.image.geometry import RandomResizedCrop

        return {"crop": RandomResizedCrop(self.augment_size), "flip": True}


@dataclass(frozen=True)
class Target:
    """One thing to read: a packed dataset, the image-folder baseline, or a packed dataset via DALI."""

    name: str
    kind: str  # packed | baseline | dali
    path: str
    preprocess: dict[str, Any] | None = None  # baseline only: the resize/crop to apply on the fly
    skip: tuple[str, ...] = ()  # baseline only: the source files the packer skipped (relative)
    # packed JPEG with augment=rrc: False decodes each JPEG whole before cropping (the row that
    # shows what decoding only the crop window, readers.image.jpegwindow, gains)
    window_decode: bool = True


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
    read_quality: dict[str, Any] | None = None  # readers.order.quality figures of the default read


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
