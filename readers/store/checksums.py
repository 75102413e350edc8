"""Checksums, defined once: sha256 of files, the CRCs of the formats, and the one comparison of a
file against what the manifest records for it. A leaf: it imports only readers.errors."""

from __future__ import annotations

import hashlib
import os
import zlib
from typing import IO

from readers.errors import ChecksumError, ManifestError

Buffer = bytes | bytearray | memoryview
LOCAL_FIX = "copy it again or re-pack the dataset"
REMOTE_FIX = "re-upload it or re-pack the dataset"
MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask


def sha256_of(fileobj: IO[bytes], chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    while block := fileobj.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def sha256_of_bytes(data: Buffer) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as fh:
        return sha256_of(fh)


def check_against_manifest(
    where: str,
    sha256: str,
    expected: str,
    size: int | None = None,
    expected_size: int | None = None,
    fix: str = LOCAL_FIX,
) -> None:
    """Raise ChecksumError naming ``where`` when a file's sha256 (or its size, where both are
    known) is not the one the manifest records: the same words on every path."""
    if size is not None and expected_size is not None and size != expected_size:
        detail = f" ({size} bytes, the manifest says {expected_size})"
    elif sha256 != expected:
        detail = ""
    else:
        return
    raise ChecksumError(f"{where}: sha256 does not match the manifest{detail} (corrupt or modified); {fix}")


def crc32(data: Buffer, start: int = 0) -> int:
    """zlib's CRC32 (continuing from ``start``), as an unsigned 32-bit value."""
    return zlib.crc32(data, start) & 0xFFFFFFFF


def crc32c(data: Buffer) -> int:
    try:
        import crc32c as impl
    except ImportError:  # pragma: no cover - a core dependency
        raise ManifestError("TFRecord files need the crc32c package: pip install crc32c") from None
    return impl.crc32c(data)


def masked_crc(data: Buffer) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF
