"""``pack info --buckets``: the bucket plan an ``AspectBuckets`` option gives a dataset, without decoding."""

from __future__ import annotations

from typing import Any

from readers.errors import OptionError


def parse_buckets(text: str) -> Any:
    """``AREA[,MULTIPLE[,MAX_RATIO]]`` as ``AspectBuckets`` (AREA: pixels, or a side like 512 -> 512**2)."""
    from readers.buckets import AspectBuckets

    parts = [p.strip() for p in text.split(",")]
    try:
        area = int(parts[0])
        multiple = int(parts[1]) if len(parts) > 1 else 64
        max_ratio = float(parts[2]) if len(parts) > 2 else 4.0
    except (ValueError, IndexError):
        raise OptionError(f"--buckets {text!r}; use AREA[,MULTIPLE[,MAX_RATIO]], e.g. 262144,64,4") from None
    if len(parts) > 3:
        raise OptionError(f"--buckets {text!r}; use AREA[,MULTIPLE[,MAX_RATIO]], e.g. 262144,64,4")
    if area <= 4096:  # a side length, not an area
        area *= area
    return AspectBuckets(area=area, multiple=multiple, max_ratio=max_ratio)


def bucket_plan(dataset: str, text: str, batch_size: int, world_size: int) -> dict[str, Any]:
    from readers.bucket_plan import sample_sizes, summary
    from readers.formats import open_reader

    buckets = parse_buckets(text)
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
        f"{plan['leftovers']} sample(s) {'padded' if plan['leftover'] == 'pad' else 'dropped'} per epoch"
    )
    return lines
