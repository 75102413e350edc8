"""What was stored: the range of stored image sizes and how many images the resize enlarged.

``write_part`` counts each part's samples (kept with the part, so resumed and Ray packs count
every sample once) and ``pack_folder`` merges the parts into the manifest's ``extra["stored"]``,
which ``pack info`` shows next to a summary of the skip reasons.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from packer.preprocess import PackedSample, PreprocessSpec, target_size

SIZE_KEYS = ("min_height", "max_height", "min_width", "max_width")


def new_stats() -> dict[str, Any]:
    return {"count": 0, "upscaled": 0}


def add_sample(stats: dict[str, Any], sample: PackedSample, spec: PreprocessSpec) -> None:
    """Count ``sample``: its stored size, and whether the resize step made it larger than its source."""
    width, height = sample.original_size
    target_w, target_h = target_size(width, height, spec)
    stats["upscaled"] += int(target_w * target_h > width * height)
    stats["count"] += 1
    for key, value in (("height", sample.height), ("width", sample.width)):
        stats[f"min_{key}"] = min(stats.get(f"min_{key}", value), value)
        stats[f"max_{key}"] = max(stats.get(f"max_{key}", value), value)


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged = new_stats()
    for part in parts:
        merged["count"] += part.get("count", 0)
        merged["upscaled"] += part.get("upscaled", 0)
        for key in SIZE_KEYS:
            if key in part:
                pick = min if key.startswith("min") else max
                merged[key] = pick(merged.get(key, part[key]), part[key])
    return merged


def reason_summary(skipped: list[dict[str, str]], most: int = 5) -> list[tuple[str, int]]:
    """The most common skip reasons, with file-specific details (list lines, quotes) removed."""
    counts: Counter[str] = Counter()
    for entry in skipped:
        reason = re.sub(r"^\S+ line \d+: ", "", entry.get("reason", ""))
        counts[re.split(r"[:(']", reason, maxsplit=1)[0].strip() or reason] += 1
    return counts.most_common(most)
