"""One packed sample as the readers see it, and the fixed binary header used to store it.

The header is plain ``struct`` data (never pickle), shared by every format that stores samples
as opaque values (LMDB today): label, encoding, shape and a CRC32. The CRC32 covers the header
fields before it as well as the image bytes, so an edited label or shape is caught like an edited
pixel; HDF5 stores the same checksum (``record_crc``) per sample.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from readers.checksums import crc32
from readers.errors import ChecksumError

Buffer = bytes | bytearray | memoryview

ENCODING_CODES = {"jpeg": 1, "png": 2, "raw": 3, "bmp": 4, "original": 5}
ENCODING_NAMES = {code: name for name, code in ENCODING_CODES.items()}

# label:int32, encoding:uint8, channels:uint8, reserved:uint16, height:uint32, width:uint32, crc32:uint32
HEADER = struct.Struct("<iBBHIII")
CHECKED = struct.Struct("<iBBHII")  # the header fields the CRC32 covers (all but the CRC itself)


class Record(NamedTuple):
    """Encoded (or raw) image bytes plus what is needed to decode and label them."""

    data: Buffer
    label: int
    height: int
    width: int
    channels: int
    encoding: str

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)


def _name(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


def record_crc(data: Buffer, label: int, height: int, width: int, channels: int, encoding: str) -> int:
    """CRC32 of a sample's label, encoding and shape followed by its image bytes."""
    fields = CHECKED.pack(label, ENCODING_CODES[encoding], channels, 0, height, width)
    return crc32(data, crc32(fields))


def pack_record(data: Buffer, label: int, height: int, width: int, channels: int, encoding: str) -> bytes:
    checksum = record_crc(data, label, height, width, channels, encoding)
    header = HEADER.pack(label, ENCODING_CODES[encoding], channels, 0, height, width, checksum)
    return header + bytes(data)


def unpack_record(value: Buffer, verify: bool = False, where: str | Callable[[], str] = "record") -> Record:
    """Split a stored value into a Record without copying the image bytes.

    ``where`` names the record in error messages; pass a callable on hot paths so the name is
    only formatted when there is an error.
    """
    view = memoryview(value)
    if len(view) < HEADER.size:
        raise ChecksumError(f"{_name(where)}: value of {len(view)} bytes is shorter than the record header")
    label, code, channels, _, height, width, checksum = HEADER.unpack_from(view)
    data = view[HEADER.size :]
    if verify and crc32(data, crc32(view[: CHECKED.size])) != checksum:
        raise ChecksumError(
            f"{_name(where)}: label, shape or image bytes do not match their checksum; the dataset is corrupt"
        )
    return Record(data, label, height, width, channels, ENCODING_NAMES.get(code, "original"))
