"""Benchmark reading imgpack's TFRecord shards: against imgpack's tar shards of the same images,
with and without the per-record data CRC, and against the ``tfrecord`` package's PyTorch reader.

All loaders produce uint8 HWC batches of 64 from 2 DataLoader workers, in file order. imgpack's
loaders assemble whole batches in the workers (``open_iterable(batch_size=64)``); the
``tfrecord`` package yields parsed examples one by one, decoded here with simplejpeg (the same
libjpeg-turbo decoder imgpack uses) and batched by the DataLoader. The loaders take turns epoch by
epoch (shared machine); the median of ``--epochs`` epochs after a warm-up epoch is reported.

    pack bench run bench_data --n 2000 --out /tmp/imgpack-bench/n2000
    pack bench run tfrecord --src /tmp/imgpack-bench/n2000 --out /tmp/imgpack-bench/tfr
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from torch.utils.data import DataLoader

from packer.bench.contenders import batch_path
from packer.bench.harness import take_turns
from packer.bench.prepare import ensure_packed

BATCH = 64
WORKERS = 2


def pack(src: Path, out: Path, fmt: str, encode: str) -> Path:
    from readers.formats.packed_sample import PreprocessSpec

    spec = PreprocessSpec(resize=256, crop=224, encode=encode)
    return ensure_packed(src, out / f"{fmt}-{encode}", fmt, spec, options={"samples_per_shard": 1000})


def imgpack_loader(root: Path, check_crc: bool = True) -> DataLoader:
    options = {"check_crc": False} if not check_crc else None
    return batch_path(root, BATCH, WORKERS, shuffle=False, layout="HWC", reader_options=options)[0]


def _decode(example: dict) -> tuple[np.ndarray, int]:
    return simplejpeg.decode_jpeg(bytes(example["image/encoded"]), colorspace="RGB"), int(
        example["image/class/label"][0]
    )


def _collate(items):
    return torch.from_numpy(np.stack([i for i, _ in items])), torch.tensor([y for _, y in items])


def tfrecord_package_loader(root: Path) -> DataLoader:
    from tfrecord.torch.dataset import MultiTFRecordDataset

    names = sorted(p.stem for p in root.glob("shard-*.tfrecord"))
    ds = MultiTFRecordDataset(
        str(root / "{}.tfrecord"),
        str(root / "{}.idx"),
        {n: 1.0 for n in names},
        description={"image/encoded": "byte", "image/class/label": "int"},
        transform=_decode,
        infinite=False,
    )
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate, persistent_workers=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="an image folder (pack bench run bench_data)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    for encode in ("jpeg", "raw"):
        tar, tfr = pack(args.src, args.out, "tar", encode), pack(args.src, args.out, "tfrecord", encode)
        loaders = {
            "imgpack tar": imgpack_loader(tar),
            "imgpack tfrecord": imgpack_loader(tfr),
            "imgpack tfrecord, check_crc=False": imgpack_loader(tfr, check_crc=False),
        }
        if encode == "jpeg":
            loaders["tfrecord package + simplejpeg"] = tfrecord_package_loader(tfr)
        measured = {name: times.median for name, times in take_turns(loaders, args.epochs).items()}
        base = measured["imgpack tfrecord"]
        for name, rate in measured.items():
            print(f"{encode:5s} {name:36s} {rate:9.0f} img/s  {rate / base:5.2f}x imgpack tfrecord")
        results[encode] = measured
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
