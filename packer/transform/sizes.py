"""The stored image size range and upscaled count the packer records in the manifest.

Each part tallies its own samples (``PartResult.extra["stored_sizes"]``, so the tally survives
``--resume`` and Ray tasks); ``merge`` combines the parts into the manifest's ``stored_sizes``,
which readers use to check ``crop=`` and batch shapes when a dataset is opened, not mid-epoch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from readers.formats.packed_sample import PackedSample

KEY = "stored_sizes"


class SizeTally:
    """Min/max stored height and width and the number of upscaled images of one part."""

    def __init__(self) -> None:
        self.count = 0
        self.upscaled = 0
        self.heights: list[int] = []  # [min, max] once a sample was added
        self.widths: list[int] = []

    def add(self, sample: PackedSample) -> None:
        h, w = sample.height, sample.width
        self.heights = [min(self.heights[0], h), max(self.heights[1], h)] if self.count else [h, h]
        self.widths = [min(self.widths[0], w), max(self.widths[1], w)] if self.count else [w, w]
        self.count += 1
        self.upscaled += bool(sample.upscaled)

    def to_dict(self) -> dict[str, int]:
        ranges = dict(zip(("min_height", "max_height", "min_width", "max_width"), self.heights + self.widths))
        return {"count": self.count, "upscaled": self.upscaled, **ranges}


def merge_sizes(parts: Iterable[dict[str, Any]]) -> dict[str, int] | None:
    """The dataset's ``stored_sizes``; None when a part has no tally (resumed from an older pack)."""
    found = [extra.get(KEY) for extra in parts]
    tallies: list[dict[str, int]] = [t for t in found if t is not None]
    if len(tallies) < len(found):
        return None
    filled = [t for t in tallies if t["count"]]
    merged = {"count": sum(t["count"] for t in tallies), "upscaled": sum(t["upscaled"] for t in tallies)}
    if filled:
        merged["min_height"] = min(t["min_height"] for t in filled)
        merged["max_height"] = max(t["max_height"] for t in filled)
        merged["min_width"] = min(t["min_width"] for t in filled)
        merged["max_width"] = max(t["max_width"] for t in filled)
    return merged
