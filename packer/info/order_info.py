"""The order a dataset was packed in and the class mix its default read gives, for ``pack info``
and ``pack bench`` (``readers.order.quality`` computes the figures)."""

from __future__ import annotations

from typing import Any

from readers.order.quality import ShuffleQuality, cheap_labels, shuffle_quality
from readers.store.manifest import Manifest

INFO_BATCH = 256  # the batch size ``pack info`` judges the mix at


def default_read_options() -> dict[str, Any]:
    """The reading defaults (``readers.spec.ReadSpec``) for the options the order depends on."""
    from readers.spec import ReadSpec

    defaults = ReadSpec()
    return {name: getattr(defaults, name) for name in ("seed", "block_size", "buffer_size")}


def read_quality(
    dataset: str, batch_size: int = INFO_BATCH, storage_options: dict[str, Any] | None = None
) -> ShuffleQuality | None:
    """The class mix of ``open_iterable(dataset, batch_size=...)`` with its defaults; None when
    the labels would need a pass over the data (a URL dataset without label runs)."""
    from readers.formats import open_reader

    reader = open_reader(dataset, storage_options=storage_options)
    labels = cheap_labels(reader)
    if labels is None or len(labels) < 2:
        return None
    return shuffle_quality(labels, batch_size=batch_size, **default_read_options())


def describe_order(manifest: Manifest, quality: ShuffleQuality | None) -> list[str]:
    order = manifest.extra.get("order")
    if order is None:
        written = "source order (packed before imgpack shuffled at pack time)"
    elif order["kind"] == "shuffled":
        written = f"shuffled at pack time (seed {order['seed']}); source paths in {order['paths']}"
    else:
        written = f"source order (--order source); source paths in {order['paths']}"
    lines = [f"order     {written}"]
    if quality is not None:
        options = ", ".join(f"{k}={v}" for k, v in default_read_options().items())
        lines.append(f"read mix  default open_iterable ({options}):")
        lines += [f"          {line}" for line in quality.lines()]
    return lines
