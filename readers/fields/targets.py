"""``target="torchvision"``: samples and batches in the shape torchvision's detection models and
transforms v2 take, with no glue in the training loop.

Each sample's target is the dict torchvision's detection references build:

- ``boxes``: float32 ``(N, 4)`` XYXY in output pixels (``tv_tensors.BoundingBoxes`` with the
  image's ``canvas_size`` when torchvision imports, else a plain tensor): the stored boxes moved
  through the sample's crop, resize and flip exactly as ``fields=["boxes"]`` moves them;
- ``labels``: int64 ``(N,)``, the box's class index (the ``categories`` field) plus
  ``label_offset`` (default 1: torchvision's detection models keep class 0 for the background, so
  they are built with ``num_classes=len(classes) + 1``; ``label_offset=0`` keeps the indices);
- ``image_id``: the stored ``image_id`` field (COCO's id) as an int, -1 where none is stored;
- ``iscrowd``: int64 ``(N,)`` (zeros where the dataset stores none);
- ``area``: float32 ``(N,)``, each returned box's area in output pixels;
- with ``masks=True``: ``masks``, uint8 ``(N, H, W)`` (``tv_tensors.Mask``) from the stored COCO
  segmentations (``readers.fields.masks``), following the image like the boxes;
- the names of ``fields=`` (a caption, ``"geometry"``...) beside them, as ``fields=`` gives them.

The image is a CHW tensor (``tv_tensors.Image`` when torchvision imports). On the per-sample path
``transform=`` receives ``(image, target)`` and returns both, so a transforms v2 pipeline runs
unchanged; the image is then handed out as float32 in [0, 1] (what the models take; a uint8 image
is scaled, a float one kept). A batch is ``(images, targets)``: two lists, the detection collate
(``detection_collate`` on the per-sample path, built into the batch path).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from readers.errors import OptionError
from readers.fields.boxes import GeometryRecord, SampleGeometry, identity_geometry, transform_boxes
from readers.fields.field_schema import as_tensors
from readers.fields.masks import SEGMENTATION, masks_for

TARGETS = ("torchvision",)
KEY = "__targets__"  # a batch's fields with target=: one NumPy target per sample, shaped on receipt


@functools.lru_cache(maxsize=1)
def tv_tensors() -> Any:
    """torchvision's ``tv_tensors`` module, or None when torchvision is missing or does not import
    beside this torch (PyPI's CUDA build beside a CPU torch: ``operator torchvision::nms``)."""
    try:
        from torchvision import tv_tensors as module
    except Exception:  # ImportError, or the RuntimeError of a torchvision built for another torch
        return None
    return module


@dataclass(frozen=True)
class DetectionTarget:
    """Which stored fields make the torchvision target of a dataset, and how."""

    boxes: str
    categories: str
    iscrowd: str | None
    image_id: str | None
    segmentation: str | None
    label_offset: int
    min_visibility: float

    @classmethod
    def of(
        cls, schema: Mapping[str, str], where: str, label_offset: int, min_visibility: float, masks: bool
    ) -> DetectionTarget:
        boxes = [n for n, k in schema.items() if k == "boxes"]
        per_box = [n for n, k in schema.items() if k == "box_ints" and n != "iscrowd"]
        category = "categories" if "categories" in per_box else per_box[0] if len(per_box) == 1 else None
        if len(boxes) != 1 or category is None:
            stored = ", ".join(f"{n} ({k})" for n, k in schema.items()) or "none"
            raise OptionError(
                f"{where}: target='torchvision' needs one boxes field and its per-box class field "
                f"(box_ints 'categories', as pack coco writes); fields stored: {stored}"
            )
        if masks and schema.get(SEGMENTATION) != "json":
            raise OptionError(
                f"{where}: masks=True draws the stored COCO segmentations, and this dataset stores none: "
                "pack it with `pack coco` from an annotation file with segmentation"
            )
        return cls(
            boxes[0],
            category,
            "iscrowd" if schema.get("iscrowd") == "box_ints" else None,
            "image_id" if schema.get("image_id") == "int" else None,
            SEGMENTATION if masks else None,
            label_offset,
            min_visibility,
        )

    def one(self, stored: Any, geometry: SampleGeometry, where: str = "") -> dict[str, Any]:
        """A sample's target as NumPy values (``stored``: its typed fields, ``geometry``: what
        was done to its image)."""
        values = stored if isinstance(stored, Mapping) else {}
        given = np.asarray(values.get(self.boxes, []), np.float32).reshape(-1, 4)
        boxes, kept = transform_boxes(given, geometry, self.min_visibility)
        xyxy = np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)
        categories = _per_box(values.get(self.categories), len(given))[kept]
        crowd = _per_box(values.get(self.iscrowd) if self.iscrowd else None, len(given))[kept]
        image_id = values.get(self.image_id) if self.image_id else None
        out: dict[str, Any] = {
            "boxes": xyxy.astype(np.float32),
            "labels": categories + self.label_offset,
            "image_id": -1 if image_id is None else int(image_id),
            "iscrowd": crowd,
            "area": (boxes[:, 2] * boxes[:, 3]).astype(np.float32),
        }
        if self.segmentation is not None:
            segmentations = values.get(self.segmentation) or []
            chosen = [segmentations[i] if i < len(segmentations) else None for i in kept.tolist()]
            out["masks"] = masks_for(chosen, geometry, where or "masks")
        return out

    def stored_one(self, stored: Any, height: int, width: int, where: str = "") -> dict[str, Any]:
        """The target of an image returned as stored (the map-style reader)."""
        return self.one(stored, identity_geometry((height, width)), where)


def _per_box(value: Any, count: int) -> np.ndarray:
    array = np.asarray(value if value is not None else np.zeros(count), dtype=np.int64).reshape(-1)
    return array if len(array) == count else np.zeros(count, np.int64)


def check_target(target: str | None, label_offset: int, layout: str, decode: str) -> None:
    """The spec's checks of ``target=`` and ``label_offset=`` (an OptionError naming the fix)."""
    if target is not None and target not in TARGETS:
        raise OptionError(f"target={target!r}; use 'torchvision' (or leave it out for (image, label))")
    if isinstance(label_offset, bool) or not isinstance(label_offset, int) or label_offset < 0:
        raise OptionError(f"label_offset={label_offset!r} must be an integer >= 0 (1: 0 is background)")
    if target is not None and (layout != "CHW" or decode != "tensor"):
        raise OptionError(
            "target='torchvision' hands out CHW tensors, as torchvision's models take them: "
            "drop layout= and decode="
        )


def shaped(target: Mapping[str, Any], height: int, width: int) -> dict[str, Any]:
    """A NumPy target as torch values: tensors, with ``tv_tensors`` types when torchvision imports."""
    import torch

    out = as_tensors({k: v for k, v in target.items()})
    tv = tv_tensors()
    if tv is not None:
        out["boxes"] = tv.BoundingBoxes(out["boxes"], format="XYXY", canvas_size=(height, width))
        if "masks" in out:
            out["masks"] = tv.Mask(out["masks"])
    elif not isinstance(out["boxes"], torch.Tensor):  # pragma: no cover - as_tensors made it one
        out["boxes"] = torch.as_tensor(out["boxes"])
    return out


def as_image(image: Any) -> Any:
    """A CHW tensor as ``tv_tensors.Image`` when torchvision imports (itself otherwise)."""
    tv = tv_tensors()
    return tv.Image(image) if tv is not None else image


def as_float(image: Any) -> Any:
    """What the detection models take: a uint8 image scaled to float32 in [0, 1]; others kept."""
    import torch

    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        scaled = image.to(torch.float32).div_(255)
        tv = tv_tensors()
        return tv.Image(scaled) if tv is not None and isinstance(image, tv.Image) else scaled
    return image


def with_fields(target: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``target`` with the ``fields=`` values of ``extra`` (a ``FieldPlan.one`` result) it lacks."""
    for name, value in (extra or {}).items():
        if name != "label":
            target.setdefault(name, value)
    return target


def sample(image: Any, target: Mapping[str, Any], transform: Any) -> tuple[Any, dict[str, Any]]:
    """One sample of the per-sample paths: (image, target) shaped, through ``transform(image,
    target)`` when given, the image then as float."""
    height, width = int(image.shape[-2]), int(image.shape[-1])
    shaped_target = shaped(target, height, width)
    picture = as_image(image)
    if transform is not None:
        picture, shaped_target = transform(picture, shaped_target)
    return as_float(picture), shaped_target


def detection_batch(images: Any, targets: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    """A whole batch (B, C, H, W) uint8 and its NumPy targets as the detection collate's two lists."""
    height, width = int(images.shape[-2]), int(images.shape[-1])
    pictures = [as_float(as_image(image)) for image in images.unbind(0)]
    return pictures, [shaped(t, height, width) for t in targets]


def received(images: Any, labels: Any, fields: dict[str, Any] | None) -> tuple[Any, Any]:
    """A batch where it is received: ``(images, labels)``, ``(images, {"label": ..., fields})`` or,
    with ``target=``, the detection collate's ``(images, targets)``."""
    if fields is None:
        return images, labels
    if KEY in fields:
        return detection_batch(images, fields[KEY])
    return images, {"label": labels, **as_tensors(fields)}


def detection_collate(batch: Sequence[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    """The per-sample path's collate with ``target=``: (list of images, list of targets), the
    shape torchvision's detection models take (``make_loader`` uses it)."""
    images, targets = zip(*batch) if batch else ((), ())
    return list(images), list(targets)


def _keep_records(batch: Sequence[Any], *, collate_fn_map: Any = None) -> list[Any]:
    return list(batch)


def _register() -> None:
    """A batch of geometry records is a list of them in torch's default collate (its documented
    extension point), as on the batch path; it runs on import, in workers too."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # pragma: no cover - a torch without the registry
        return
    default_collate_fn_map[GeometryRecord] = _keep_records


_register()
