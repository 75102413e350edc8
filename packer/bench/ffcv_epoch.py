"""FFCV's side of ``pack bench --cold --peer ffcv``, run by FFCV's own Python (``--ffcv-python``):
one epoch of a ``.beton`` in a fresh process, and the ``.beton`` writer.

Only the standard library at import time (numpy and FFCV inside the functions that need them):
FFCV's interpreter has none of imgpack's dependencies.

    python -m packer.bench.ffcv_epoch read '<json>'    # one JSON line, as packer.bench.cold_epoch's
    python -m packer.bench.ffcv_epoch write '<json>'   # an export of the stored bytes -> .beton

The read is FFCV's setting for data larger than memory, as the parent
(``packer.bench._ffcv_peer``) asks for it: ``os_cache=False`` (FFCV reads whole pages of the file
into its own memory with its own threads, in the order's page schedule) and
``OrderOption.QUASI_RANDOM`` (a random order drawn from a few pages at a time);
``CenterCropRGBImageDecoder`` to ``crop`` with ``ratio`` (crop / the stored shorter side, so the
window is the same ``crop`` pixels imgpack's cold epoch takes); uint8 (B, 3, crop, crop) batches.

The writer keeps the dataset's stored bytes: FFCV's ``RGBImageField`` only takes decoded pixels
and encodes them itself (OpenCV, its own quality), so this field's ``encode`` is replaced, on the
instance (the ``.beton`` names the field by its class), by one that stores the bytes it is given
as they are, in FFCV's own image record (mode ``jpg`` or ``raw``, height, width, data).
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

INDEX = "records.npy"  # per record: offset, length, height, width, label, mode (0 jpg, 1 raw)
DATA = "records.bin"  # the stored bytes, one record after another
COLUMNS = ("offset", "length", "height", "width", "label", "mode")
MODES = ("jpg", "raw")  # FFCV's image modes, as the export's mode column numbers them


def loader_options(settings: dict[str, Any]) -> dict[str, Any]:
    """The ``ffcv.loader.Loader`` keywords of ``settings`` (order by its ``OrderOption`` name)."""
    return {
        "batch_size": settings["batch_size"],
        "num_workers": settings["workers"],
        "order": settings["order"],
        "os_cache": settings["os_cache"],
        "seed": settings["seed"],
        "drop_last": False,  # every image, as imgpack's epoch reads them
        "distributed": False,
    }


def read_epoch(settings: dict[str, Any]) -> dict[str, Any]:
    """One epoch of ``settings["beton"]``: the figures ``packer.bench.cold_epoch`` prints, timed
    from building the loader (FFCV's imports done, as imgpack's epoch process has done its own) to
    the last batch; FFCV compiles its pipeline before the first batch (seconds, once a process)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import Squeeze, ToTensor, ToTorchImage

    start = time.perf_counter()
    crop = settings["crop"]
    decoder = CenterCropRGBImageDecoder((crop, crop), ratio=settings["ratio"])
    pipelines = {
        "image": [decoder, ToTensor(), ToTorchImage()],
        "label": [IntDecoder(), ToTensor(), Squeeze()],
    }
    options = loader_options(settings)
    options["order"] = getattr(OrderOption, options["order"])
    loader = Loader(settings["beton"], pipelines=pipelines, **options)
    loader.next_epoch = settings.get("epoch", 0)  # the order of this epoch (FFCV counts them itself)
    images = 0
    first: tuple[float, int] | None = None  # (seconds, images) when the first batch was in hand
    for _, labels in loader:
        images += len(labels)
        if first is None:
            first = (time.perf_counter() - start, images)
    seconds = time.perf_counter() - start
    first_s, first_images = first or (seconds, images)
    return {"images": images, "bytes": 0, "seconds": seconds, "hinted_bytes": 0,
            "first_batch_s": first_s, "first_batch_images": first_images}  # fmt: skip


class Exported:
    """The export ``packer.bench._ffcv_peer.export_records`` wrote, as FFCV's writer reads a
    dataset: ``[i]`` is ((mode, height, width, stored bytes), label)."""

    def __init__(self, folder: str | Path):
        import numpy as np

        self.index = np.load(Path(folder) / INDEX)
        self.data = np.memmap(Path(folder) / DATA, dtype=np.uint8, mode="r") if self.index.size else None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[tuple[str, int, int, Any], int]:
        offset, length, height, width, label, mode = (int(v) for v in self.index[i])
        assert self.data is not None
        return (MODES[mode], height, width, self.data[offset : offset + length]), label


def encode_stored(field: Any, destination: Any, image: tuple[str, int, int, Any], malloc: Any) -> None:
    """``RGBImageField.encode`` for an image already encoded: its bytes stored as they are."""
    from ffcv.fields.rgb_image import IMAGE_MODES

    mode, height, width, data = image
    destination["mode"] = IMAGE_MODES[mode]
    destination["height"], destination["width"] = height, width
    destination["data_ptr"], storage = malloc(len(data))
    storage[:] = data


def write_beton(settings: dict[str, Any]) -> None:
    """The export in ``settings["export"]`` -> the ``.beton`` ``settings["beton"]``."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    image = RGBImageField(write_mode="jpg", max_resolution=None)
    image.encode = types.MethodType(encode_stored, image)  # type: ignore[method-assign]
    fields = {"image": image, "label": IntField()}
    workers, page_size = settings.get("workers", 2), settings["page_size"]
    writer = DatasetWriter(settings["beton"], fields, num_workers=workers, page_size=page_size)
    writer.from_indexed_dataset(Exported(settings["export"]))


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("read", "write"):
        raise SystemExit("usage: python -m packer.bench.ffcv_epoch read|write '<json settings>'")
    settings = json.loads(argv[1])
    if argv[0] == "write":
        write_beton(settings)
    else:
        print(json.dumps(read_epoch(settings)))


if __name__ == "__main__":
    main(sys.argv[1:])
