"""Near-duplicate search over 64-bit hashes: multi-index hashing with sorted bands.

The 64 bits are cut into ``m`` bands. If two hashes differ in at most ``D`` bits, at least one
band differs in at most ``D // m`` bits (pigeonhole), so every pair within ``D`` is found by
looking up, in each band, the keys within ``D // m`` bits of the query's band value. Each band is
an argsort of the indexed hashes by band value plus a table of where each value starts (CSR),
so a lookup is two array reads; candidates are then checked on all 64 bits. ``m`` is chosen
per search from ``D`` and the index size (the fewest lookups plus expected candidates). The
pack-time deduplicator (``IncrementalIndex``) is the same scheme on dicts, grown one hash at a
time.
"""

from __future__ import annotations

import itertools
from math import comb

import numpy as np

MAX_BAND_BITS = 22  # a band's start table has 2**bits entries (16 MiB of int32 at 22)
CHUNK_KEYS = 1 << 22  # query x key lookups per step, bounding memory


def band_layout(distance: int, n: int, max_bits: int = MAX_BAND_BITS) -> list[tuple[int, int]]:
    """(shift, bits) of each band: the cut with the least expected work for ``n`` indexed hashes."""
    best: tuple[float, list[tuple[int, int]]] | None = None
    for m in range(max(1, -(-64 // max_bits)), 17):
        radius = distance // m
        widths = [64 // m + (1 if i < 64 % m else 0) for i in range(m)]
        cost = sum(sum(comb(b, k) for k in range(radius + 1)) * (1 + n / 2**b) for b in widths)
        shifts = [sum(widths[:i]) for i in range(m)]
        if best is None or cost < best[0]:
            best = (cost, list(zip(shifts, widths)))
    assert best is not None
    return best[1]


def flip_masks(bits: int, radius: int) -> np.ndarray:
    """Every value of ``bits`` bits with at most ``radius`` bits set."""
    masks = [0]
    for k in range(1, radius + 1):
        masks += [sum(1 << i for i in combo) for combo in itertools.combinations(range(bits), k)]
    return np.asarray(masks, dtype=np.uint64)


def near_pairs(
    indexed: np.ndarray, queries: np.ndarray, distance: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query position, indexed position, distance) of every pair within ``distance`` bits,
    sorted by query then indexed position, each pair once."""
    indexed = np.ascontiguousarray(indexed, dtype=np.uint64)
    queries = np.ascontiguousarray(queries, dtype=np.uint64)
    layout = band_layout(distance, len(indexed))
    radius = distance // len(layout)
    found_q, found_a = [], []
    for shift, bits in layout:
        mask = np.uint64((1 << bits) - 1)
        values = ((indexed >> np.uint64(shift)) & mask).astype(np.int64)
        order = np.argsort(values, kind="stable").astype(np.int64)
        counts = np.bincount(values, minlength=1 << bits).astype(np.int32)
        starts = np.zeros((1 << bits) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        flips = flip_masks(bits, radius).astype(np.int64)
        step = max(1, CHUNK_KEYS // len(flips))
        qvalues = ((queries >> np.uint64(shift)) & mask).astype(np.int64)
        for lo in range(0, len(queries), step):
            keys = (qvalues[lo : lo + step, None] ^ flips[None, :]).ravel()
            lens = counts[keys]
            hit = np.flatnonzero(lens)  # most keys of a wide band name no indexed hash
            if len(hit) == 0:
                continue
            keys, lens = keys[hit], lens[hit].astype(np.int64)
            first = starts[keys]
            total = int(lens.sum())
            qpos = np.repeat(lo + hit // len(flips), lens)
            offsets = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(first, lens)
            apos = order[offsets]
            close = np.bitwise_count(indexed[apos] ^ queries[qpos]) <= distance
            found_q.append(qpos[close])
            found_a.append(apos[close])
    if not found_q:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty.astype(np.uint8)
    q, a = np.concatenate(found_q), np.concatenate(found_a)
    pair = np.unique(q * max(1, len(indexed)) + a)  # found in several bands: once
    q, a = pair // max(1, len(indexed)), pair % max(1, len(indexed))
    return q, a, np.bitwise_count(indexed[a] ^ queries[q])


def exact_matches(indexed: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query digest (void 16), the first indexed position with the same digest, or -1."""
    ikeys = _digest_keys(indexed)
    qkeys = _digest_keys(queries)
    order = np.lexsort((np.arange(len(ikeys)), ikeys[:, 1], ikeys[:, 0]))
    sorted_keys = ikeys[order]
    combined = sorted_keys[:, 0].copy()
    at = np.searchsorted(combined, qkeys[:, 0], side="left")
    out = np.full(len(queries), -1, dtype=np.int64)
    for i in np.flatnonzero(at < len(combined)):  # only queries whose first half matches somewhere
        j = int(at[i])
        while j < len(combined) and combined[j] == qkeys[i, 0]:
            if sorted_keys[j, 1] == qkeys[i, 1]:
                out[i] = order[j]
                break
            j += 1
    return out


def _digest_keys(digests: np.ndarray) -> np.ndarray:
    return np.frombuffer(np.ascontiguousarray(digests).tobytes(), dtype=">u8").reshape(-1, 2)


class IncrementalIndex:
    """The same bands on dicts, for a stream: ``nearest`` among what was ``add``-ed so far."""

    def __init__(self, distance: int, expected: int = 100_000):
        self.distance = distance
        self.layout = band_layout(distance, expected, max_bits=32)
        radius = distance // len(self.layout)
        self.flips = [[int(f) for f in flip_masks(bits, radius)] for _, bits in self.layout]
        self.bands: list[dict[int, list[int]]] = [{} for _ in self.layout]
        self.hashes: list[int] = []

    def _values(self, h: int) -> list[int]:
        return [(h >> shift) & ((1 << bits) - 1) for shift, bits in self.layout]

    def nearest(self, h: int) -> tuple[int, int] | None:
        """(id, distance) of the closest hash added (the first added on a tie), None past D."""
        best: tuple[int, int] | None = None
        for band, value, flips in zip(self.bands, self._values(h), self.flips):
            for flip in flips:
                for i in band.get(value ^ flip, ()):
                    d = (self.hashes[i] ^ h).bit_count()
                    if d <= self.distance and (best is None or (d, i) < (best[1], best[0])):
                        best = (i, d)
        return best

    def add(self, h: int) -> int:
        i = len(self.hashes)
        self.hashes.append(h)
        for band, value in zip(self.bands, self._values(h)):
            band.setdefault(value, []).append(i)
        return i
