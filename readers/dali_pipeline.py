"""The DALI pipeline behind ``readers.dali``: external_source -> decode -> resize -> crop/normalise.

Imported only when DALI runs. The graph is the same on the CPU and the GPU; only the decoder's
device (``mixed`` = nvJPEG / hardware decoder, or ``cpu``) and where the images live differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from readers.dali_feed import PIXEL_ENCODINGS, BatchFeed, crop_box


def start_method() -> str:
    """``fork`` is cheap but unsafe once this process holds a CUDA context; ``spawn`` then."""
    return "spawn" if torch.cuda.is_initialized() else "fork"


def build_pipeline(
    feed: BatchFeed,
    *,
    gpu: bool,
    num_threads: int,
    device_id: int | None,
    py_workers: int,
    prefetch: int,
    seed: int,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    output_layout: str,
) -> Pipeline:
    parallel = py_workers > 0
    extra = {"py_num_workers": py_workers, "py_start_method": start_method()} if parallel else {}
    source_args = {"parallel": True, "prefetch_queue_depth": max(2, prefetch)} if parallel else {}
    pipe = Pipeline(
        batch_size=feed.batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch,
        seed=seed,
        **extra,
    )
    pixels = feed.encoding in PIXEL_ENCODINGS
    gray = feed.channels == 1
    with pipe:
        outputs = fn.external_source(
            source=feed,
            num_outputs=feed.num_outputs,
            batch=True,
            batch_info=True,
            **source_args,
            dtype=[types.UINT8, types.INT64, types.FLOAT][: feed.num_outputs],
            ndim=[3 if pixels else 1, 0, 1][: feed.num_outputs],
            layout=["HWC" if pixels else "", "", ""][: feed.num_outputs],
        )
        data, labels = outputs[0], outputs[1]
        if pixels:
            images = data.gpu() if gpu else data
        else:
            decode_args = {"jpeg_fancy_upsampling": True} if gpu else {}
            images = fn.decoders.image(
                data,
                device="mixed" if gpu else "cpu",
                output_type=types.GRAY if gray else types.RGB,
                adjust_orientation=False,  # records are stored upright; the CPU decoders ignore EXIF too
                **decode_args,
            )
        if feed.resize is not None:
            images = fn.resize(images, size=outputs[2], interp_type=types.INTERP_LINEAR, antialias=True)
        cmn = {"dtype": types.UINT8}
        if mean is not None:
            cmn = {"dtype": types.FLOAT, "mean": list(map(float, mean)), "std": list(map(float, std))}
        if feed.crop is not None:
            _, _, ch, cw = crop_box(0, 0, feed.crop)
            cmn.update(crop=(ch, cw), crop_pos_x=0.5, crop_pos_y=0.5)
        images = fn.crop_mirror_normalize(images, output_layout=output_layout, **cmn)
        pipe.set_outputs(images, labels.gpu() if gpu else labels)
    if parallel:
        pipe.start_py_workers()
    pipe.build()
    return pipe
