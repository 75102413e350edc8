"""What a format's writer is handed: the ``PackedSample`` (one preprocessed image and its facts)
and the ``PreprocessSpec`` that made it (stored in the manifest, so a dataset records exactly how
it was made). Plain data only: the image processing that makes samples is packer/transform/preprocess.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from readers.errors import OptionError
from readers.store.manifest import ENCODINGS

RESIZE_MODES = ("shorter", "longer", "exact")
# "auto": the readers' resampler (readers.image.resample), so ``--resize N`` at pack time and
# ``resize=N`` at read time of a lossless original give the same pixels; the others are Pillow's.
AUTO_RESAMPLE = "auto"
PILLOW_RESAMPLERS = ("nearest", "bilinear", "bicubic", "lanczos")
RESAMPLERS = (AUTO_RESAMPLE, *PILLOW_RESAMPLERS)
# Pillow's own default limit; images above it are refused as possible decompression bombs.
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(frozen=True)
class PreprocessSpec:
    resize: int | None = None
    resize_mode: str = "shorter"
    crop: int | None = None
    encode: str = "jpeg"
    quality: int = 90
    mode: str = "RGB"
    upscale: bool = False
    resample: str = AUTO_RESAMPLE
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.encode not in ENCODINGS:
            raise OptionError(f"encode={self.encode!r}; use one of {', '.join(ENCODINGS)}")
        if self.resize_mode not in RESIZE_MODES:
            raise OptionError(f"resize_mode={self.resize_mode!r}; use one of {', '.join(RESIZE_MODES)}")
        if self.mode not in ("RGB", "L"):
            raise OptionError(f"mode={self.mode!r}; use RGB or L")
        if self.resample not in RESAMPLERS:
            raise OptionError(f"resample={self.resample!r}; use one of {', '.join(RESAMPLERS)}")
        if not 1 <= self.quality <= 100:
            raise OptionError(f"quality={self.quality} must be between 1 and 100")
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(f"{name}={value} must be a positive number of pixels")
        if self.encode == "original" and (self.resize or self.crop or self.mode != "RGB"):
            raise OptionError(
                "encode=original stores the source bytes unchanged; drop --resize/--crop/--mode"
            )
        if self.crop and self.resize and self.crop > self.resize:
            raise OptionError(
                f"--crop {self.crop} is larger than --resize {self.resize}: every image would have to be "
                f"enlarged again after resizing; use --crop {self.resize} or less (or a larger --resize)"
            )

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """(height, width) every output image has, if the spec guarantees one."""
        if self.crop:
            return self.crop, self.crop
        if self.resize and self.resize_mode == "exact":
            return self.resize, self.resize
        return None

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreprocessSpec:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class PackedSample:
    source_index: int
    rel: str
    label: int
    data: bytes
    height: int
    width: int
    channels: int
    encoding: str
    original_size: tuple[int, int]  # (width, height) of the source after EXIF orientation
    upscaled: bool = False  # enlarged on the way (only with --upscale, or --resize-mode exact)
    # its index in the dataset, given when its part is written (packer/engine/parts.py)
    dataset_index: int = -1
    fields: str = ""  # the sample's fields, canonical JSON (readers.fields.field_schema.encode); "": none
    # The source's EXIF orientation (1-8, 1 when it has none): the stored pixels are upright, so a
    # box given in the file's raw pixel grid turns with them (packer.transform.box_geometry.orient_boxes).
    orientation: int = 1
    phash: int = 0  # the 64-bit perceptual hash of the stored pixels (readers/store/sample_hashes.py)
    digest: bytes = b""  # the exact content hash of ``data``
