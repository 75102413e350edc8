"""torchvision's detection stack on ``target="torchvision"`` reads, with no glue: run once where
torchvision imports (it cannot be a CI dependency: see docs/detection.md for the builds that pair).

    python scripts/check_torchvision.py --out /tmp/tv-check [--steps 5]

On a generated COCO set (boxes and rectangle polygons drawn into the pixels) it checks:

1. the map-style targets against torchvision's own ``CocoDetection`` wrapped for transforms v2 on
   the same annotation file: equal XYXY boxes, labels (COCO's category ids vs class index + 1:
   the same order), masks (IoU);
2. a Faster R-CNN (MobileNetV3 FPN, fast on a CPU) and a Mask R-CNN (ResNet-50 FPN), both
   ``weights=None, weights_backbone=None``, train a few steps
   from ``make_loader`` batches of the batch path (RandomResizedCrop + flip, 2 workers);
3. a transforms v2 pipeline (``RandomZoomOut``, ``RandomHorizontalFlip``,
   ``SanitizeBoundingBoxes``) runs unchanged as ``transform=`` on the per-sample path, its
   output trains the detector too.

Prints one JSON report (and exits 1 when a check fails).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any


def make_data(out: Path, count: int) -> tuple[Path, Path]:
    """A COCO set with rectangle polygons as segmentations, packed to TFRecord."""
    from packer.bench.coco_data import add_rectangle_polygons, make_coco
    from packer.cli import main as pack

    coco = add_rectangle_polygons(make_coco(out / "coco", count=count, empty=2))
    packed = out / "coco-tfr"
    if not packed.exists():
        args = [
            "coco",
            str(coco),
            "--root",
            str(coco.parent / "images"),
            "--to",
            "tfrecord",
            "-o",
            str(packed),
        ]
        pack([*args, "--order", "source", "--workers", "1", "-q"], standalone_mode=False)
    return coco, packed


def compare_with_coco_detection(coco: Path, packed: Path) -> dict[str, Any]:
    import numpy as np
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    from readers import open_dataset

    theirs = wrap_dataset_for_transforms_v2(
        CocoDetection(str(coco.parent / "images"), str(coco)),
        target_keys={"image_id", "boxes", "labels", "masks"},
    )
    ours = open_dataset(packed, target="torchvision", masks=True)
    ids = sorted(c["id"] for c in json.loads(coco.read_text())["categories"])
    worst_box, worst_iou, compared = 0.0, 1.0, 0
    for index in range(len(ours)):
        image, target = ours[index]
        _, want = theirs[index]
        assert target["image_id"] == want["image_id"]
        if "boxes" not in want:  # torchvision's wrapper leaves the keys out of an image without boxes
            assert len(target["boxes"]) == 0
            continue
        assert type(target["boxes"]).__name__ == "BoundingBoxes" and target["boxes"].format.name == "XYXY"
        assert tuple(target["boxes"].canvas_size) == tuple(want["boxes"].canvas_size)
        worst_box = max(worst_box, float((target["boxes"] - want["boxes"]).abs().max()))
        assert [ids[i - 1] for i in target["labels"].tolist()] == want["labels"].tolist()
        for a, b in zip(np.asarray(target["masks"]) > 0, np.asarray(want["masks"]) > 0):
            worst_iou = min(worst_iou, float((a & b).sum() / max(1, (a | b).sum())))
        compared += len(target["boxes"])
    assert worst_box < 1e-3 and worst_iou >= 0.95, (worst_box, worst_iou)
    return {"boxes_compared": compared, "max_box_difference_px": worst_box, "min_mask_iou": worst_iou}


SMALL = {"min_size": 128, "max_size": 128}  # the models' own resize: keep the generated 128 px images


def train(model: Any, loader: Any, steps: int) -> list[float]:
    import torch

    optimiser = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    model.train()
    losses: list[float] = []
    for images, targets in loader:  # the loader's batches as they come: no conversion
        loss = sum(model(images, targets).values())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
        if len(losses) == steps:
            break
    assert len(losses) == steps and all(math.isfinite(v) for v in losses), losses
    return losses


def batch_path(packed: Path, classes: int, steps: int) -> dict[str, Any]:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn, maskrcnn_resnet50_fpn

    from readers import RandomResizedCrop, make_loader, open_iterable

    report: dict[str, Any] = {}
    models = [
        ("fasterrcnn_mobilenet_v3", fasterrcnn_mobilenet_v3_large_fpn, False),
        ("maskrcnn", maskrcnn_resnet50_fpn, True),
    ]
    for name, build, masks in models:
        it = open_iterable(packed, batch_size=4, crop=RandomResizedCrop(128, scale=(0.5, 1.0)), flip=True,
                           target="torchvision", masks=masks, min_visibility=0.2)  # fmt: skip
        model = build(weights=None, weights_backbone=None, num_classes=classes + 1, **SMALL)
        started = time.perf_counter()
        losses = train(model, make_loader(it, num_workers=2), steps if not masks else max(2, steps // 2))
        report[name] = {"losses": losses, "seconds": round(time.perf_counter() - started, 1)}
    return report


def per_sample_path(packed: Path, classes: int, steps: int) -> dict[str, Any]:
    import torch
    from torchvision import tv_tensors
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
    from torchvision.transforms import v2

    from readers import make_loader, open_iterable

    pipeline = v2.Compose(
        [
            v2.RandomZoomOut(
                fill={tv_tensors.Image: (123, 117, 104), "others": 0}, side_range=(1.0, 2.0), p=1.0
            ),
            v2.RandomHorizontalFlip(),
            v2.Resize((128, 128)),
            v2.SanitizeBoundingBoxes(min_size=2),
        ]
    )
    it = open_iterable(packed, shuffle=True, target="torchvision", transform=pipeline)
    checked = 0
    for image, target in it:
        assert (
            isinstance(image, tv_tensors.Image)
            and image.dtype == torch.float32
            and image.shape[-2:] == (128, 128)
        )
        boxes = target["boxes"]
        assert isinstance(boxes, tv_tensors.BoundingBoxes) and tuple(boxes.canvas_size) == (128, 128)
        assert len(target["labels"]) == len(boxes)  # SanitizeBoundingBoxes found and filtered them
        assert bool(((boxes[:, 2:] - boxes[:, :2]) >= 2).all())
        checked += 1
        if checked == 16:
            break
    model = fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=classes + 1, **SMALL
    )
    losses = train(model, make_loader(it, batch_size=4, num_workers=2), steps)
    return {"samples_checked": checked, "fasterrcnn_losses": losses}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    import torchvision

    from readers.fields.targets import tv_tensors

    torch.manual_seed(0)
    torch.set_num_threads(max(1, args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    report["tv_tensors_used"] = tv_tensors() is not None
    coco, packed = make_data(args.out, args.count)
    classes = len(json.loads(coco.read_text())["categories"])
    failed = False
    for name, check in [
        ("coco_detection_oracle", lambda: compare_with_coco_detection(coco, packed)),
        ("batch_path", lambda: batch_path(packed, classes, args.steps)),
        ("per_sample_v2_pipeline", lambda: per_sample_path(packed, classes, args.steps)),
    ]:
        print(f"{name}...", file=sys.stderr, flush=True)
        try:
            report[name] = check()
        except Exception as exc:  # the report says which check failed and why
            report[name] = {"failed": f"{type(exc).__name__}: {exc}"}
            failed = True
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
