"""Duplicates inside a pack (``pack dups``) and between two packs (``pack overlap``), from the
hashes the packs store (readers/store/sample_hashes.py), or, for a pack made before they were
stored, computed on the fly from its records (decoded, with a progress bar).

A near pair is two samples whose perceptual hashes differ in at most ``distance`` bits, found
by multi-index hashing (readers/store/near_index.py); an exact pair has the same stored bytes.
Groups of ``pack dups`` are formed as ``--dedup`` would keep them (see ``groups_of``).

``--indices-out`` files hold one dataset index per line, '#' lines are comments: of the pack for
``dups`` (every member of a group but its first), of B for ``overlap`` (each sample of B found
in A); views of a dataset read the same format.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import ImgpackError
from readers.formats import open_reader
from readers.image.decode import decode_array
from readers.store.manifest import read_manifest
from readers.store.near_index import exact_matches, near_pairs
from readers.store.sample_hashes import HASH_RECORD, PERCEPTUAL, digest_of, hashes_of, phash_of_array

BLOCK = 256  # records read (and hashed) at a time when a pack has no stored hashes


@dataclass
class Hashes:
    dataset: str
    records: np.ndarray  # HASH_RECORD per sample, in dataset order
    stored: bool  # read from the sidecar (False: computed here from the images)


def load_hashes(
    dataset: str, storage_options: dict[str, Any] | None = None, progress: bool = False
) -> Hashes:
    """The hash records of ``dataset``: its sidecar's when it has one (read alone: no part of
    the dataset is opened), else computed from its records."""
    manifest = read_manifest(dataset, storage_options)
    entry = manifest.extra.get("hashes")
    if entry is not None and isinstance(entry, dict) and entry.get("perceptual") not in (None, PERCEPTUAL):
        raise ImgpackError(
            f"{dataset}: its stored perceptual hash is {entry.get('perceptual')!r}, not {PERCEPTUAL!r} "
            "(made by another imgpack); re-pack it to compare"
        )
    records = hashes_of(dataset, storage_options)
    if records is not None:
        return Hashes(dataset, records, True)
    reader = open_reader(dataset, storage_options=storage_options)
    try:
        return Hashes(dataset, _computed(reader, dataset, progress), False)
    finally:
        reader.close()


def _computed(reader: Any, dataset: str, progress: bool) -> np.ndarray:
    from tqdm import tqdm

    total = len(reader)
    table = np.zeros(total, dtype=HASH_RECORD)
    desc = f"hashing {Path(str(dataset)).name} (no stored hashes)"
    with tqdm(total=total, unit="img", desc=desc, disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, total, BLOCK):
            stop = min(total, start + BLOCK)
            for i, record in enumerate(reader.read_block(start, stop), start):
                table[i]["phash"] = phash_of_array(decode_array(record))
                table[i]["digest"] = np.void(digest_of(bytes(record.data)))
            bar.update(stop - start)
    return table


@dataclass(frozen=True)
class Pair:
    a: int  # index in A (for dups: the earlier sample)
    b: int  # index in B (for dups: the later sample)
    distance: int
    kind: str  # "exact" or "near"

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "distance": self.distance, "kind": self.kind}


def overlap_pairs(a: np.ndarray, b: np.ndarray, distance: int) -> list[Pair]:
    """For each sample of ``b`` with an exact or near copy in ``a``: the pair with its closest copy
    (an exact one first, then the least distance, then the lowest index of ``a``)."""
    exact = exact_matches(a["digest"], b["digest"])
    q, i, d = near_pairs(a["phash"], b["phash"], distance)
    best: dict[int, Pair] = {
        int(bi): Pair(int(ai), int(bi), 0, "exact") for bi, ai in enumerate(exact) if ai >= 0
    }
    order = np.lexsort((i, d, q))
    for k in order:
        bi = int(q[k])
        if bi not in best:
            best[bi] = Pair(int(i[k]), bi, int(d[k]), "near")
    return [best[k] for k in sorted(best)]


def dup_pairs(records: np.ndarray, distance: int) -> list[Pair]:
    """Every pair (earlier, later) of samples of one pack within ``distance`` bits or equal."""
    q, i, d = near_pairs(records["phash"], records["phash"], distance)
    keep = i < q
    pairs = {(int(x), int(y)): int(z) for x, y, z in sorted(zip(i[keep], q[keep], d[keep]))}
    digests = records["digest"]
    first = exact_matches(digests, digests)  # each sample's first sample with the same bytes
    for later, earlier in enumerate(first):
        if earlier < later:
            pairs[(int(earlier), later)] = 0
    same = [digests[x] == digests[y] for x, y in pairs]
    return [Pair(x, y, dist, "exact" if eq else "near") for ((x, y), dist), eq in zip(pairs.items(), same)]


def groups_of(pairs: list[Pair], count: int) -> list[list[int]]:
    """Groups of two samples or more, as ``--dedup`` keeps them: in index order, a sample joins
    the group of the closest earlier sample that heads a group (exact first, then the least
    distance, then the lowest index), so a chain of small differences never merges unlike images."""
    earlier: dict[int, list[Pair]] = {}
    for pair in pairs:
        earlier.setdefault(pair.b, []).append(pair)
    head_of: dict[int, int] = {}
    for b in sorted(earlier):
        heads = [p for p in earlier[b] if p.a not in head_of]
        if heads:
            best = min(heads, key=lambda p: (p.kind != "exact", p.distance, p.a))
            head_of[b] = best.a
    members: dict[int, list[int]] = {}
    for b, a in head_of.items():
        members.setdefault(a, [a]).append(b)
    return sorted(sorted(m) for m in members.values())


def write_indices(path: str | os.PathLike, indices: list[int], comment: str) -> None:
    """One dataset index per line after '#' comment lines (the --indices-out format)."""
    lines = [f"# {line}" for line in comment.splitlines()] + [str(i) for i in indices]
    try:
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ImgpackError(f"{path}: cannot write the index list ({exc.strerror or exc})") from None


def read_indices(path: str | os.PathLike) -> list[int]:
    """The indices of an --indices-out file (comments and blank lines skipped)."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not text.isdigit():
            raise ImgpackError(f"{path}:{number}: {text!r} is not a dataset index; one index per line")
        out.append(int(text))
    return out
