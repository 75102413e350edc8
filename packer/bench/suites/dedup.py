"""Benchmarks of the per-sample hashes: near-duplicate recall, ``pack overlap`` at scale, and
what hashing adds to ``pack imagefolder``.

    pack bench run dedup recall --distinct 300      # planted set: imgpack's hash vs imagehash pHash
    pack bench run dedup overlap --big 1000000 --small 50000
    pack bench run dedup cost --images 400 --rounds 3

``recall``: every distinct image (packer/bench/planted.py) and one copy per edit kind, hashed
as a pack hashes (``preprocess_file``, --resize 256) and by ``imagehash.phash`` of the decoded
copy; recall = copies within D bits of their original, false = distinct pairs within D.
``overlap``: synthetic uniform 64-bit hashes (and random digests), with planted near and exact
copies in the small set; the search ``pack overlap`` runs on stored hashes, timed, with its peak
memory (tracemalloc: numpy's allocations). ``cost``: the same pack with and without hashing
(the hash functions replaced by constants in the forked workers), alternating, median of rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from packer.bench.planted import KINDS, planted, synthetic

DISTANCES = (4, 6, 8, 10, 12, 14, 16)


def recall(distinct: int, seed: int = 0) -> dict[str, Any]:
    import io

    from PIL import Image

    from packer.transform.preprocess import preprocess_file
    from readers.formats.packed_sample import PreprocessSpec

    try:
        import imagehash  # the independent reference (dev extra)
    except ImportError:  # pragma: no cover
        imagehash = None  # type: ignore[assignment]
    spec = PreprocessSpec(resize=256)
    ids, copies, ours, theirs = [], [], [], []
    for image_id, copy, data, _ in planted(distinct, KINDS, seed):
        ids.append(image_id)
        copies.append(copy)
        ours.append(preprocess_file("planted.jpg", "planted.jpg", 0, 0, spec, data).phash)
        if imagehash is not None:
            with Image.open(io.BytesIO(data)) as img:
                theirs.append(int(str(imagehash.phash(img.convert("RGB"))), 16))
    out: dict[str, Any] = {"distinct": distinct, "copies": len(ids) - distinct, "kinds": list(KINDS)}
    out["imgpack"] = _table(np.asarray(ours, dtype=np.uint64), np.asarray(ids), np.asarray(copies))
    if theirs:
        out["imagehash_phash"] = _table(
            np.asarray(theirs, dtype=np.uint64), np.asarray(ids), np.asarray(copies)
        )
    return out


def _table(hashes: np.ndarray, ids: np.ndarray, copies: np.ndarray) -> dict[str, Any]:
    originals = hashes[copies == 0]
    to_original = np.bitwise_count(hashes[copies > 0] ^ originals[ids[copies > 0]])
    kinds = copies[copies > 0]
    upper = np.triu_indices(len(originals), 1)
    between = np.bitwise_count(originals[:, None] ^ originals[None, :])[upper]
    rows = {}
    for d in DISTANCES:
        row = {"recall": round(float((to_original <= d).mean()), 4)}
        row |= {k: round(float((to_original[kinds == i] <= d).mean()), 3) for i, k in enumerate(KINDS, 1)}
        row["false_pairs"] = int((between <= d).sum())
        row["false_rate"] = float((between <= d).mean())
        rows[str(d)] = row
    return {"pairs_between_distinct": len(between), "by_distance": rows}


def overlap(big: int, small: int, distance: int, seed: int = 0) -> dict[str, Any]:
    from packer.dedup.overlap import overlap_pairs
    from readers.store.sample_hashes import HASH_RECORD

    rng = np.random.default_rng(seed)
    a = np.zeros(big, dtype=HASH_RECORD)
    a["phash"] = rng.integers(0, 2**63, big, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(
        0, 2, big
    ).astype(np.uint64)
    a["digest"] = np.frombuffer(rng.bytes(16 * big), dtype="V16")
    b = np.zeros(small, dtype=HASH_RECORD)
    b["phash"] = rng.integers(0, 2**63, small, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    b["digest"] = np.frombuffer(rng.bytes(16 * small), dtype="V16")
    planted_near = min(1000, small // 10)
    for k in range(planted_near):  # near copies: up to ``distance`` bits flipped
        bits = rng.choice(64, int(rng.integers(1, distance + 1)), replace=False)
        b["phash"][k] = a["phash"][k * 7] ^ np.uint64(sum(1 << int(x) for x in bits))
    b[planted_near : planted_near + planted_near // 2] = a[: planted_near // 2]  # exact copies
    tracemalloc.start()
    started = time.perf_counter()
    pairs = overlap_pairs(a, b, distance)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    found = {p.b for p in pairs}
    planted_found = sum(k in found for k in range(planted_near + planted_near // 2))
    sidecars = (big + small) * HASH_RECORD.itemsize / 2**20
    return {
        "big": big, "small": small, "distance": distance, "seconds": round(seconds, 2),
        "peak_mib": round(peak / 2**20, 1), "sidecar_mib": round(sidecars, 1),
        "found": len(pairs), "planted": planted_near + planted_near // 2, "planted_found": planted_found,
    }  # fmt: skip


def cost(images: int, rounds: int, workers: int) -> dict[str, Any]:
    import packer.transform.preprocess as preprocess
    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    real = (preprocess.phash_of_image, preprocess.digest_of)
    with tempfile.TemporaryDirectory(prefix="imgpack-bench-dedup-") as tmp:
        src = Path(tmp) / "src"
        for i in range(images):
            folder = src / f"c{i % 4}"
            folder.mkdir(parents=True, exist_ok=True)
            synthetic(i, (640, 480)).save(folder / f"{i}.jpg", quality=90)
        times: dict[str, list[float]] = {"hashed": [], "unhashed": []}
        for r in range(rounds):
            for kind in ("hashed", "unhashed") if r % 2 == 0 else ("unhashed", "hashed"):
                if kind == "hashed":
                    preprocess.phash_of_image, preprocess.digest_of = real
                else:
                    preprocess.phash_of_image, preprocess.digest_of = (lambda img: 0), (lambda data: b"")
                out = Path(tmp) / f"out-{r}-{kind}"
                started = time.perf_counter()
                pack_folder(src, out, "lmdb", PreprocessSpec(resize=256), workers=workers)
                times[kind].append(time.perf_counter() - started)
        preprocess.phash_of_image, preprocess.digest_of = real
    hashed, unhashed = statistics.median(times["hashed"]), statistics.median(times["unhashed"])
    paired = [h / u for h, u in zip(times["hashed"], times["unhashed"])]
    return {"images": images, "workers": workers, "rounds": rounds, "seconds": times,
            "ratio_of_medians": round(hashed / unhashed, 3),
            "median_paired_ratio": round(statistics.median(paired), 3),
            "per_image": per_image_share()}  # fmt: skip


def per_image_share(repeats: int = 300) -> dict[str, float]:
    """One worker's view, in this process (no pool, no disk): ``preprocess_file`` of a 640x480
    JPEG at --resize 256 against the hashing it includes (median of 5 timings each)."""
    import io

    from PIL import Image

    from packer.transform.preprocess import preprocess_file
    from readers.formats.packed_sample import PreprocessSpec
    from readers.store.sample_hashes import digest_of, phash_of_image

    buffer = io.BytesIO()
    synthetic(1, (640, 480)).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    spec = PreprocessSpec(resize=256)
    stored = preprocess_file("x.jpg", "x.jpg", 0, 0, spec, data)
    pixels = Image.open(io.BytesIO(stored.data))
    pixels.load()

    def timed(fn: Any) -> float:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeats):
                fn()
            runs.append((time.perf_counter() - started) / repeats)
        return statistics.median(runs)

    whole = timed(lambda: preprocess_file("x.jpg", "x.jpg", 0, 0, spec, data))
    hashing = timed(lambda: (phash_of_image(pixels), digest_of(stored.data)))
    return {"preprocess_ms": round(whole * 1e3, 3), "hashing_ms": round(hashing * 1e3, 3),
            "share": round(hashing / whole, 3)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("recall", help="near-duplicate recall on a planted set, beside imagehash's pHash")
    r.add_argument("--distinct", type=int, default=300, help="distinct images (the photos, then synthetic)")
    r.add_argument("--seed", type=int, default=0)
    o = sub.add_parser("overlap", help="pack overlap's search on synthetic stored hashes")
    o.add_argument("--big", type=int, default=1_000_000)
    o.add_argument("--small", type=int, default=50_000)
    o.add_argument("--distance", type=int, default=None, help="default: pack overlap's")
    c = sub.add_parser("cost", help="pack imagefolder time with and without hashing")
    c.add_argument("--images", type=int, default=400)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.what == "recall":
        result = recall(args.distinct, args.seed)
    elif args.what == "overlap":
        from packer.dedup.deduper import DEFAULT_NEAR_DISTANCE

        result = overlap(
            args.big, args.small, args.distance if args.distance is not None else DEFAULT_NEAR_DISTANCE
        )
    else:
        result = cost(args.images, args.rounds, args.workers)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
