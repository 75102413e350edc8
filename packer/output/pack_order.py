"""The order a pack writes its samples in, and how each sample gets its dataset index.

A pack writes the source in a seeded permutation (``--order shuffled``, the default;
``readers.order.epoch_order.pack_order``), so a reader that takes blocks of consecutive records still sees
classes mixed, even from a class-sorted folder. The permutation is applied to the compact scan
table as an index array (no per-file Python objects) and the parts are cut from the permuted
sequence, so every engine and worker count writes the same bytes.

A kept sample's dataset index is its part's first index plus its position among the part's
kept samples; where the parts are cut, and how a cut is corrected once the skips are known, is
packer/engine/_part_plan.py.

``source-paths.nul`` maps dataset index -> source path: the relative path of every sample, in
dataset order, UTF-8 (``surrogateescape``) and NUL-terminated (``readers.store.sample_sources``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packer.engine.parts import SKIPPED_AT_KEY
from packer.scan.source_items import SourceItems, rel_run
from readers.formats.writer_base import PartResult
from readers.order.epoch_order import pack_order
from readers.store.sample_sources import SOURCE_PATHS_NAME

Parts = list[tuple[int, Any]]  # (part number, its items)


def ordered_items(items: Sequence[Any], kind: str, seed: int) -> Sequence[Any]:
    """``items`` in the pack's order (a view of the compact table, or a list)."""
    rows = pack_order(len(items), kind, seed)
    if kind == "source":
        return items
    if isinstance(items, SourceItems):
        return items.reordered(rows)
    return [items[i] for i in rows.tolist()]


def order_record(kind: str, seed: int) -> dict[str, Any]:
    """What the manifest records about the order (``extra["order"]``)."""
    return {"kind": kind, "seed": seed if kind == "shuffled" else None, "paths": SOURCE_PATHS_NAME}


def write_source_paths(work: Path, parts: Parts, done: dict[int, PartResult]) -> Path:
    """``source-paths.nul``: the source path of each dataset index (skipped files left out)."""
    path = work / SOURCE_PATHS_NAME
    with open(path, "wb") as fh:
        for p, items in parts:
            keep = np.ones(len(items), dtype=bool)
            keep[np.asarray(done[p].extra.get(SKIPPED_AT_KEY, []), dtype=np.int64)] = False
            if isinstance(items, SourceItems):
                for run in items.rel_runs(np.flatnonzero(keep)):
                    fh.write(run)
            else:
                fh.write(rel_run([items[int(i)] for i in np.flatnonzero(keep)]))
    return path
