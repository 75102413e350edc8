"""Per-sample hashes: an exact digest of the stored image bytes and a 64-bit perceptual hash.

The perceptual hash is the DCT pHash: the image in grey, shrunk to 32x32, its 2-D DCT-II, the
8x8 lowest frequencies, one bit per coefficient above their median. Resizing, recompression,
small crops and small brightness changes move it by a few bits (docs/dedup.md has the recall
measured). The pack computes both where the pixels already are (packer/preprocess.py, in the
workers), from the pixels it encodes, and stores them in one sidecar file beside the shards:
``HASH_RECORD`` per sample in dataset order, named by the manifest's ``extra.hashes`` entry
({file, dtype, bytes, sha256}, sealed with the manifest like ``extra.labels``).
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from readers.checksums import sha256_of_bytes
from readers.errors import ManifestError

HASHES_NAME = "hashes.bin"
HASHES_DTYPE = "phash64-blake2b128"  # what the entry's dtype names: HASH_RECORD below
HASH_RECORD = np.dtype([("phash", "<u8"), ("digest", "V16")])
ITEM = HASH_RECORD.itemsize  # 24 bytes a sample
DIGEST_BYTES = 16
PHASH_SIDE = 32  # the image is shrunk to this square before the DCT
PHASH_KEEP = 8  # the lowest KEEP x KEEP frequencies give the 64 bits


def digest_of(data: bytes) -> bytes:
    """The exact content hash of stored image bytes (BLAKE2b, 128 bits)."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


@lru_cache(maxsize=1)
def _dct_matrix() -> np.ndarray:
    n = PHASH_SIDE
    k = np.arange(n)[:, None]
    x = np.arange(n)[None, :]
    return np.cos(np.pi * (2 * x + 1) * k / (2 * n))[:PHASH_KEEP].astype(np.float64)


def phash_of_grey(small: np.ndarray) -> int:
    """The 64-bit pHash of a PHASH_SIDE x PHASH_SIDE grey image (any numeric dtype)."""
    dct = _dct_matrix()
    low = dct @ small.astype(np.float64) @ dct.T  # the KEEP x KEEP lowest frequencies
    bits = (low > np.median(low)).ravel()
    return int(np.packbits(bits).view(">u8")[0])


def phash_of_image(img: Any) -> int:
    """The pHash of a Pillow image (any mode Pillow converts to grey)."""
    from PIL import Image

    grey = img if img.mode == "L" else img.convert("L")
    small = grey.resize((PHASH_SIDE, PHASH_SIDE), Image.Resampling.BOX, reducing_gap=2.0)
    return phash_of_grey(np.asarray(small))


def phash_of_array(pixels: np.ndarray) -> int:
    """The pHash of decoded pixels (H, W) or (H, W, C) uint8."""
    from PIL import Image

    array = pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels
    return phash_of_image(Image.fromarray(np.ascontiguousarray(array)))


def pack_records(phashes: Any, digests: list[bytes]) -> bytes:
    """The sidecar bytes of samples with these hashes, in order."""
    table = np.zeros(len(digests), dtype=HASH_RECORD)
    table["phash"] = np.asarray(phashes, dtype=np.uint64)
    table["digest"] = np.frombuffer(b"".join(digests), dtype="V16") if digests else []
    return table.tobytes()


def hashes_entry(data: bytes, name: str = HASHES_NAME) -> dict[str, Any]:
    """The manifest's ``extra.hashes`` entry for a sidecar holding ``data`` under ``name``."""
    return {"file": name, "dtype": HASHES_DTYPE, "bytes": len(data), "sha256": sha256_of_bytes(data)}


def parse_hashes_entry(entry: Any, samples: int, where: str) -> tuple[str, int, str]:
    """(file, bytes, sha256) of a manifest ``extra.hashes`` entry, checked against ``samples``."""
    try:
        name, size, sha = entry["file"], entry["bytes"], entry["sha256"]
        ok = entry.get("dtype") == HASHES_DTYPE and isinstance(name, str) and isinstance(sha, str)
        ok = ok and type(size) is int and "/" not in name and name not in ("", ".", "..")
    except (TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise ManifestError(f"{where} is not a {{file, dtype: {HASHES_DTYPE}, bytes, sha256}} entry; re-pack")
    if size != samples * ITEM:
        raise ManifestError(f"{where} says {size} bytes, not {ITEM} for each of {samples} samples; re-pack")
    return name, size, sha


def is_hashes_name(name: str) -> bool:
    """Whether ``name`` is a hash sidecar's (``hashes.bin``, or a versioned ``hashes-<v>.bin``)."""
    return name == HASHES_NAME or (name.startswith("hashes-") and name.endswith(".bin") and "/" not in name)


def stored_hashes(reader: Any) -> np.ndarray | None:
    """The dataset's hash records (HASH_RECORD, one per sample) from its sidecar, size and sha256
    checked against the manifest; None for a pack made before hashes were stored."""
    entry = reader.manifest.extra.get("hashes")
    if entry is None:
        return None
    from readers.errors import ChecksumError

    where = f"{reader.root}: manifest field 'extra.hashes'"
    name, size, sha = parse_hashes_entry(entry, len(reader), where)
    try:
        if reader.parts is not None:
            data = reader.parts.read(name)
        else:
            data = Path(reader.part_path(name)).read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            f"{reader.location(name)}: hash file listed in the manifest is missing; copy it again, or re-pack"
        ) from None
    if len(data) != size or sha256_of_bytes(data) != sha:
        raise ChecksumError(
            f"{reader.location(name)}: hash file does not match the manifest's size and sha256 "
            "(damaged or replaced); copy it again, or re-pack"
        )
    return np.frombuffer(data, dtype=HASH_RECORD)


def hashes_of(dataset: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> np.ndarray | None:
    """The stored hash records of ``dataset`` (a path or URL), None when it has none."""
    from readers.formats import open_reader

    reader = open_reader(str(dataset), storage_options=storage_options)
    try:
        return stored_hashes(reader)
    finally:
        reader.close()
