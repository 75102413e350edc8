"""Per-sample hashes: an exact digest of the stored image bytes and a 64-bit perceptual hash.

The perceptual hash is the average hash (aHash): the image in grey, shrunk by box filtering to
8x8, one bit per cell brighter than the mean. Measured on a planted set (docs/dedup.md,
packer/bench/suites/dedup.py) it kept near copies closer than a DCT pHash or a difference hash at the
same false-pair rate: resizing, recompression and brightness changes move it by a few bits,
crops of up to 10% a side by up to ~12. The pack computes both hashes where the pixels already
are (packer/transform/preprocess.py, in the workers), from the pixels it encodes, and stores them in one
sidecar file beside the shards: ``HASH_RECORD`` per sample in dataset order, named by the
manifest's ``extra.hashes`` entry ({file, dtype, perceptual, bytes, sha256}, sealed with the
manifest like ``extra.labels``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from readers.errors import ManifestError
from readers.store.checksums import sha256_of_bytes

HASHES_NAME = "hashes.bin"
HASHES_DTYPE = "phash64-blake2b128"  # what the entry's dtype names: HASH_RECORD below
HASH_RECORD = np.dtype([("phash", "<u8"), ("digest", "V16")])
ITEM = HASH_RECORD.itemsize  # 24 bytes a sample
DIGEST_BYTES = 16
SIDE = 8  # the image is shrunk to SIDE x SIDE cells: 64 bits
PERCEPTUAL = "ahash-8x8-box"  # the perceptual hash the entry records (a different one is not comparable)


def digest_of(data: bytes) -> bytes:
    """The exact content hash of stored image bytes (BLAKE2b, 128 bits)."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def ahash_of_grey(small: np.ndarray) -> int:
    """The 64-bit aHash of an 8x8 grey image (any numeric dtype)."""
    cells = small.astype(np.float64)
    return int(np.packbits((cells > cells.mean()).ravel()).view(">u8")[0])


def phash_of_image(img: Any) -> int:
    """The perceptual hash of a Pillow image (any mode Pillow converts to grey)."""
    from PIL import Image

    grey = img if img.mode == "L" else img.convert("L")
    if grey.width > 4 * SIDE and grey.height > 4 * SIDE:
        grey = grey.reduce(max(1, min(grey.width, grey.height) // (4 * SIDE)))  # fewer pixels to box
    return ahash_of_grey(np.asarray(grey.resize((SIDE, SIDE), Image.Resampling.BOX)))


def phash_of_array(pixels: np.ndarray) -> int:
    """The perceptual hash of decoded pixels (H, W) or (H, W, C) uint8."""
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
    return {
        "file": name,
        "dtype": HASHES_DTYPE,
        "perceptual": PERCEPTUAL,
        "bytes": len(data),
        "sha256": sha256_of_bytes(data),
    }


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

    def read(name: str) -> tuple[str, bytes]:
        local = reader.parts is None
        return reader.location(name), Path(
            reader.part_path(name)
        ).read_bytes() if local else reader.parts.read(name)

    return _sidecar(reader.manifest, str(reader.root), read)


def hashes_of(dataset: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> np.ndarray | None:
    """The stored hash records of ``dataset`` (a path or URL), None when it has none. Only the
    manifest and the sidecar are read: no part of the dataset is opened (they may be elsewhere)."""
    from readers.remote.urls import is_url, join_url, read_url
    from readers.store.manifest import read_manifest

    def read(name: str) -> tuple[str, bytes]:
        if is_url(dataset):
            return join_url(str(dataset), name), read_url(join_url(str(dataset), name), storage_options)
        return str(Path(dataset) / name), (Path(dataset) / name).read_bytes()

    return _sidecar(read_manifest(dataset, storage_options), str(dataset), read)


def _sidecar(manifest: Any, root: str, read: Any) -> np.ndarray | None:
    """The records of the sidecar ``manifest`` names, ``read(name)`` giving (where, its bytes)."""
    from readers.errors import ChecksumError

    entry = manifest.extra.get("hashes")
    if entry is None:
        return None
    name, size, sha = parse_hashes_entry(
        entry, manifest.num_samples, f"{root}: manifest field 'extra.hashes'"
    )
    try:
        where, data = read(name)
    except FileNotFoundError:
        raise ManifestError(
            f"{root}/{name}: hash file listed in the manifest is missing; copy it again, or re-pack"
        ) from None
    if len(data) != size or sha256_of_bytes(data) != sha:
        raise ChecksumError(
            f"{where}: hash file does not match the manifest's size and sha256 (damaged or replaced); "
            "copy it again, or re-pack"
        )
    return np.frombuffer(data, dtype=HASH_RECORD)
