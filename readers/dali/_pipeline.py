"""The DALI pipeline behind ``readers.dali``: external_source -> decode -> resize -> crop -> flip/normalise.

Imported only when DALI runs. The graph is the same on the CPU and the GPU; only the decoder's
device (``mixed`` = nvJPEG / hardware decoder, or ``cpu``) and where the images live differ.
With ``fields=`` the feed's carried outputs (``readers.dali._fields``) are pipeline outputs as fed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from readers.dali._feed import PIXEL_ENCODINGS, BatchFeed
from readers.dali._fields import OUTPUTS


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
    layout: str,
) -> Pipeline:
    parallel = py_workers > 0
    extra = {"py_num_workers": py_workers, "py_start_method": start_method()} if parallel else {}
    source_args: dict[str, Any] = (
        {"parallel": True, "prefetch_queue_depth": max(2, prefetch)} if parallel else {}
    )
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
    window_first = feed.window_first  # the window is cut from the stored image, then resized
    names = feed.output_names
    spec = {  # name: (dtype, ndim, layout) of each external_source output
        "data": (types.UINT8, 3 if pixels else 1, "HWC" if pixels else ""),
        "labels": (types.INT64, 0, ""),
        "sizes": (types.FLOAT, 1, ""),
        "anchor": (types.FLOAT, 1, ""),
        "shape": (types.FLOAT, 1, ""),
        "mirror": (types.INT32, 0, ""),
        # carried through untouched with fields= (readers/dali/_fields.py)
        "fields": (types.UINT8, 1, ""),
        "fields_length": (types.INT64, 1, ""),
        "geometry": (types.INT64, 1, ""),
    }
    window: dict[str, Any] = {"axis_names": "HW", "normalized_anchor": False, "normalized_shape": False}
    with pipe:
        outputs = fn.external_source(
            source=feed,
            num_outputs=len(names),
            batch=True,
            batch_info=True,
            **source_args,
            dtype=[spec[n][0] for n in names],
            ndim=[spec[n][1] for n in names],
            layout=[spec[n][2] for n in names],
        )
        out = dict(zip(names, outputs))
        data, labels = out["data"], out["labels"]
        if pixels:
            images = data.gpu() if gpu else data
            if window_first:
                images = fn.slice(images, out["anchor"], out["shape"], **window)
        else:
            decode_args = {
                "device": "mixed" if gpu else "cpu",
                "output_type": types.GRAY if gray else types.RGB,
                "adjust_orientation": False,  # records are stored upright; the CPU decoders ignore EXIF too
            }
            if gpu:
                decode_args["jpeg_fancy_upsampling"] = True
            if window_first:  # decode only the window's region
                images = fn.decoders.image_slice(data, out["anchor"], out["shape"], **window, **decode_args)
            else:
                images = fn.decoders.image(data, **decode_args)
        resize = {"interp_type": types.INTERP_LINEAR, "antialias": True}
        if "sizes" in out:  # resize=, or each sample's bucket (readers/dali/_buckets.py)
            images = fn.resize(images, size=out["sizes"], **resize)
        if feed.random_crop is not None:
            images = fn.resize(images, size=[float(v) for v in feed.random_crop.out], **resize)
        elif feed.crop is not None:  # the centre window, at the offsets readers.image.geometry computed
            images = fn.slice(images, out["anchor"], out["shape"], **window)
        cmn = {"dtype": types.UINT8}
        if mean is not None:
            assert std is not None  # dali_loader takes mean and std together
            cmn = {"dtype": types.FLOAT, "mean": list(map(float, mean)), "std": list(map(float, std))}
        if "mirror" in out:
            cmn["mirror"] = out["mirror"]
        images = fn.crop_mirror_normalize(images, output_layout=layout, **cmn)
        carried = [out[name] for name in OUTPUTS if name in out]  # stay on the CPU: read in Python
        pipe.set_outputs(images, labels.gpu() if gpu else labels, *carried)
    if parallel:
        pipe.start_py_workers()
    pipe.build()
    return pipe
