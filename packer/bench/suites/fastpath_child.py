"""The child side of the ``fastpath`` suite: one contender's loader on one workload, timed in a
fresh process, one JSON line out; and FFCV's ``.beton`` writer.

Only the standard library and ``packer.bench.harness`` at import time, so the FFCV interpreter
(``--ffcv-python``, without imgpack's dependencies) runs it too:
``python -m packer.bench.suites.fastpath_child --child NAME --workload W --paths JSON``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

# The shared timer; the standard library only at import, so FFCV's Python can run it.
from packer.bench.harness import count_images, time_epochs

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", required=True, help="a contender, or ffcv-write")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--paths", default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--data", default=None)
    parser.add_argument("--beton", default=None)
    args = parser.parse_args()
    if args.child == "ffcv-write":
        ffcv_write(args.workload, args.data, args.beton)
    else:
        child(args)


if __name__ == "__main__":
    main()
