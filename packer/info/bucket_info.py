"""``pack info --buckets``: the bucket plan an ``AspectBuckets`` option gives a dataset, without decoding."""

from __future__ import annotations

from typing import Any

from readers.errors import OptionError


def parse_buckets(text: str, leftover: str = "pad") -> Any:
    """``SIDE[,MULTIPLE[,MAX_RATIO]]`` as ``AspectBuckets(area=SIDE**2, ..., leftover=leftover)``."""
    from readers.bucketing.buckets import AspectBuckets

    parts = [p.strip() for p in text.split(",")]
    try:
        side = int(parts[0])
        multiple = int(parts[1]) if len(parts) > 1 else 64
        max_ratio = float(parts[2]) if len(parts) > 2 else 4.0
    except (ValueError, IndexError):
        raise OptionError(f"--buckets {text!r}; use SIDE[,MULTIPLE[,MAX_RATIO]], e.g. 512,64,4") from None
    if len(parts) > 3:
        raise OptionError(f"--buckets {text!r}; use SIDE[,MULTIPLE[,MAX_RATIO]], e.g. 512,64,4")
    return AspectBuckets(area=side * side, multiple=multiple, max_ratio=max_ratio, leftover=leftover)


def bucket_plan(
    dataset: str, text: str, batch_size: int, world_size: int, leftover: str = "pad"
) -> dict[str, Any]:
    from readers.bucketing.bucket_plan import sample_sizes, summary
    from readers.formats import open_reader

    buckets = parse_buckets(text, leftover)
    reader = open_reader(dataset)
    try:
        return summary(buckets, sample_sizes(reader), batch_size, world_size)
    finally:
        reader.close()


def describe_plan(plan: dict[str, Any]) -> list[str]:
    total = sum(b["samples"] for b in plan["buckets"]) or 1
    lines = [f"buckets   (batch {plan['batch_size']}, {plan['world_size']} rank(s))"]
    for b in plan["buckets"]:
        h, w = b["size"]
        bar = "#" * max(1, round(40 * b["samples"] / total))
        lines.append(f"  {h:>5}x{w:<5} {b['samples']:>8}  {bar}")
    lines.append(
        f"  pixels kept {100 * plan['kept']:.1f}% (square centre crop: {100 * plan['kept_square']:.1f}%); "
        f"{leftovers_text(plan)}"
    )
    return lines


def leftovers_text(plan: dict[str, Any]) -> str:
    """What the leftover rule does per epoch, in words."""
    if plan["leftover"] == "carry":
        return f"0 samples padded or dropped ({plan['carried']} carried from epoch 0 into epoch 1)"
    return f"{plan['leftovers']} sample(s) {'padded' if plan['leftover'] == 'pad' else 'dropped'} per epoch"


def save_bucket_sheets(dataset: str, out: str, text: str, n: int = 16, cell: int = 128) -> list[str]:
    """One PNG per bucket with samples (``out`` with ``-HxW`` before its suffix): up to ``n`` of
    its images as the bucketed read returns them, scaled to ``cell`` pixels high. The paths written."""
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from readers.datasets.iterable import PackedIterable

    it = PackedIterable(dataset, batch_size=1, buckets=parse_buckets(text), layout="HWC", seed=0)
    by_bucket: dict[tuple[int, int], list[np.ndarray]] = {}
    for images, _ in it:
        image = images[0].numpy()
        shown = by_bucket.setdefault(image.shape[:2], [])
        if len(shown) < n:
            shown.append(image)
    target = Path(out)
    written = []
    for (h, w), images in sorted(by_bucket.items()):
        width = max(1, round(cell * w / h))
        columns = min(len(images), 8)
        rows = -(-len(images) // columns)
        sheet = Image.new("RGB", (columns * width, rows * cell))
        for k, image in enumerate(images):
            tile = Image.fromarray(image.squeeze()).convert("RGB").resize((width, cell))
            sheet.paste(tile, ((k % columns) * width, (k // columns) * cell))
        path = target.with_name(f"{target.stem}-{h}x{w}{target.suffix or '.png'}")
        sheet.save(path)
        written.append(str(path))
    return written
