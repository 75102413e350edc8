#!/usr/bin/env python3
"""Decode only the window against decoding the whole JPEG, on one core, per window scale.

For each window scale s (the window covers a fraction s of the stored image, aspect ratio 1 when
it fits), the batch path's per-image work (decode, crop, resize to 224, no flip) is timed with
the window decoder (``readers.image.jpegwindow``) and with it switched off (simplejpeg decodes the
whole image, DCT-scaled the same way, then the crop), on the same records and windows, in one
process, no DataLoader. Rounds alternate the two, and the median of the rounds is reported, so
load from other users of the machine falls on both alike.

    pack bench run jpegwindow n2000-256.lmdb n2000-full.lmdb --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import readers.batch.batch_slot
from readers import RandomResizedCrop
from readers.batch.batch_assembler import BatchAssembler
from readers.formats import open_reader
from readers.image.jpegwindow import decode_window

SCALES = (0.08, 0.3, 1.0)


def images_per_second(assembler: BatchAssembler, records, params, out: np.ndarray, windowed: bool):
    """(images per wall second, images per CPU second of this process) for one pass."""
    readers.batch.batch_slot.decode_window = decode_window if windowed else (lambda *args, **kwargs: None)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(records), len(out)):
        chunk = records[i : i + len(out)]
        assembler.fill(chunk, out[: len(chunk)], params[i : i + len(out)])
    return len(records) / (time.perf_counter() - start), len(records) / (time.process_time() - cpu)


def measure(path: str, count: int, rounds: int, fast_dct: bool) -> dict:
    reader = open_reader(path)
    indices = np.arange(min(count, len(reader)))
    records = reader.read_many(indices)
    out = np.empty((64, 224, 224, 3), np.uint8)
    result: dict = {"dataset": path, "images": len(records), "fast_dct": fast_dct, "scales": {}}
    for scale in SCALES:
        crop = RandomResizedCrop(224, scale=(scale, scale), ratio=(1.0, 1.0))
        assembler = BatchAssembler(crop=crop, fast_dct=fast_dct)
        params = assembler.params(records, indices, 0)
        rows: dict[str, list[tuple[float, float]]] = {"window": [], "whole": []}
        for r in range(rounds):
            order = ("window", "whole") if r % 2 == 0 else ("whole", "window")
            for name in order:
                rows[name].append(images_per_second(assembler, records, params, out, name == "window"))
        # Per CPU second as well: on a shared machine wall time also counts other users' turns.
        figures = {}
        for name, runs in rows.items():
            figures[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        (window, window_cpu), (whole, whole_cpu) = figures["window"], figures["whole"]
        result["scales"][str(scale)] = {
            "window_img_s": round(window),
            "whole_img_s": round(whole),
            "ratio": round(window / whole, 2),
            "window_img_per_cpu_s": round(window_cpu),
            "whole_img_per_cpu_s": round(whole_cpu),
            "cpu_ratio": round(window_cpu / whole_cpu, 2),
            "rounds": rows,
        }
        print(f"{path}  scale {scale:<5} window {window:7,.0f} img/s ({window_cpu:7,.0f}/CPU s)  "
              f"whole {whole:7,.0f} img/s ({whole_cpu:7,.0f}/CPU s)  {window / whole:.2f}x "
              f"({window_cpu / whole_cpu:.2f}x per CPU s)", flush=True)  # fmt: skip
    readers.batch.batch_slot.decode_window = decode_window
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("datasets", nargs="+", help="packed datasets of JPEG records")
    parser.add_argument("--images", type=int, default=640, help="records per round (default 640)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fast-dct", action="store_true", help="libjpeg-turbo's fast IDCT on both sides")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    results = [measure(path, args.images, args.rounds, args.fast_dct) for path in args.datasets]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
