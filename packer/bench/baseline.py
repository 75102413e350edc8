"""The benchmark's baseline: an image folder read the way torchvision's ImageFolder reads it.

Each item opens its file with Pillow, converts it and resizes / centre-crops it on the fly to
what the packed dataset stores (its manifest ``preprocess``), so both produce the same output.
Deliberately without the packer's tricks (no DCT-domain downscaling): this is what a training
script without packing does. With ``crop=RandomResizedCrop(...)`` (and ``flip``) it does
torchvision's training transform instead, on the original file: a random window (the same
sampler as imgpack's), Pillow's bilinear resize of the window, a left-right flip.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from packer.sources.source import scan_folder
from packer.transform.preprocess import resize_image, target_size
from readers.errors import DecodeError
from readers.formats.packed_sample import PreprocessSpec
from readers.image.geometry import TRIES, RandomResizedCrop, centre_window, flip_probability


class ImageFolderBaseline(Dataset):
    """``root/<class>/<image>`` read like torchvision's ImageFolder: Pillow, on-the-fly resize/crop.

    A map-style dataset (``__len__``/``__getitem__``), so a DataLoader batches and parallelises it.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        preprocess: dict[str, Any] | None = None,
        decode: str = "tensor",
        crop: RandomResizedCrop | None = None,
        flip: bool | float = False,
        skip: Collection[str] = (),
    ):
        """``skip``: paths relative to ``root`` (posix) left out, the files the packer skipped."""
        scan = scan_folder(root)
        self.root = str(root)
        self.classes = scan.classes
        skip = set(skip)
        self.samples = [
            (item.path, item.label)
            for item in scan.items
            if not skip or Path(os.path.relpath(item.path, root)).as_posix() not in skip
        ]
        self.spec = PreprocessSpec.from_dict(preprocess) if preprocess else None
        if self.spec is not None and self.spec.encode == "original":
            self.spec = None  # the packed data kept the source bytes: no resize to mirror
        self.decode = decode
        self.crop = crop
        self.flip = flip_probability(flip)
        self._rng: np.random.Generator | None = None  # per process, made on first use

    def augment(self, img: Image.Image) -> Image.Image:
        """torchvision's RandomResizedCrop (bilinear) + RandomHorizontalFlip, with Pillow."""
        if self._rng is None:
            self._rng = np.random.default_rng()
        if self.crop is not None:
            top, left, h, w = self.crop.window(img.height, img.width, self._rng.random(4 * TRIES).tolist())
            oh, ow = self.crop.out
            img = img.crop((left, top, left + w, top + h)).resize((ow, oh), Image.Resampling.BILINEAR)
        if self._rng.random() < self.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return img

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, path: str) -> Image.Image:
        with open(path, "rb") as fh:
            img: Image.Image = Image.open(fh).convert(self.spec.mode if self.spec else "RGB")
        spec = self.spec
        if self.crop is not None or self.flip:
            return self.augment(img)  # the training read: on the original file
        if spec is None:
            return img
        size = target_size(img.width, img.height, spec)
        if size != img.size:
            img = resize_image(img, size, spec.resample)
        if spec.crop:
            top, left, h, w = centre_window(img.height, img.width, (spec.crop, spec.crop))
            img = img.crop((left, top, left + w, top + h))
        return img

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        if self.decode == "bytes":
            with open(path, "rb") as fh:
                return fh.read(), label
        try:
            img = self.load(path)
        except (OSError, SyntaxError, ValueError) as exc:  # what Pillow raises for a damaged file
            raise DecodeError(
                f"{path}: the baseline cannot decode it ({exc}); remove it from {self.root}, or pack "
                "the folder first (pack bench skips what the packer skipped)"
            ) from None
        if self.decode == "pil":
            return img, label
        from readers.image.decode import to_output

        array = np.asarray(img)
        return to_output(array[:, :, None] if array.ndim == 2 else array, self.decode), label


def collate_list(batch: list[tuple[Any, Any]]) -> tuple[list[Any], Any]:
    """A batch of images of different sizes (or bytes, or PIL images): a list plus a label tensor."""
    import torch

    return [image for image, _ in batch], torch.tensor([int(label) for _, label in batch])
