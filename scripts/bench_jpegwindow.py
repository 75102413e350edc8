#!/usr/bin/env python3
"""Decode only the window against decoding the whole JPEG, on one core, per window scale.

For each window scale s (the window covers a fraction s of the stored image, aspect ratio 1 when
it fits; "rrc": RandomResizedCrop's own draw, scale 0.08-1, ratio 3/4-4/3), the batch path's
per-image work (decode, crop, resize to 224, no flip) is timed three ways on the same records and
windows, in one process, no DataLoader: the window decoder (``readers.jpegwindow``) as it runs,
entropy decoding from the restart marker above the window where the JPEG has them; the window
decoder skipping the rows above instead (``FROM_RESTART_MARKERS = False``); and the window
decoder switched off (simplejpeg decodes the whole image, DCT-scaled the same way, then the
crop). Rounds rotate the order, and the median of the rounds is reported, so load from other
users of the machine falls on all alike.

    python scripts/bench_jpegwindow.py n2000-256.lmdb n2000-full.lmdb --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import readers.batch  # noqa: E402
from readers import RandomResizedCrop, jpegwindow  # noqa: E402
from readers.batch import BatchAssembler  # noqa: E402
from readers.formats import open_reader  # noqa: E402
from readers.jpegwindow import decode_window  # noqa: E402

SCALES = (0.08, 0.3, 1.0, "rrc")
SYSTEMS = ("window", "skip rows", "whole")


def images_per_second(assembler: BatchAssembler, records, params, out: np.ndarray, system: str):
    """(images per wall second, images per CPU second of this process) for one pass."""
    windowed = system != "whole"
    readers.batch.decode_window = decode_window if windowed else (lambda *args, **kwargs: None)  # type: ignore[attr-defined]
    jpegwindow.FROM_RESTART_MARKERS = system == "window"
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
        if scale == "rrc":
            crop = RandomResizedCrop(224)
        else:
            crop = RandomResizedCrop(224, scale=(scale, scale), ratio=(1.0, 1.0))
        assembler = BatchAssembler(crop=crop, fast_dct=fast_dct)
        params = assembler.params(records, indices, 0)
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in SYSTEMS}
        for r in range(rounds):
            for name in SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]:
                rows[name].append(images_per_second(assembler, records, params, out, name))
        # Per CPU second as well: on a shared machine wall time also counts other users' turns.
        figures = {}
        for name, runs in rows.items():
            figures[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        whole, whole_cpu = figures["whole"]
        entry: dict = {"rounds": rows}
        line = f"{path}  scale {scale:<5}"
        for name, (wall, cpu) in figures.items():
            key = name.replace(" ", "_")
            entry.update({f"{key}_img_s": round(wall), f"{key}_img_per_cpu_s": round(cpu)})
            entry[f"{key}_ratio"] = round(wall / whole, 2)
            entry[f"{key}_cpu_ratio"] = round(cpu / whole_cpu, 2)
            line += f"  {name} {wall:7,.0f} img/s ({cpu:7,.0f}/CPU s, {wall / whole:.2f}x)"
        result["scales"][str(scale)] = entry
        print(line, flush=True)
    readers.batch.decode_window = decode_window  # type: ignore[attr-defined]
    jpegwindow.FROM_RESTART_MARKERS = True
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
