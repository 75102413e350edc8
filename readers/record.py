"""One packed sample as the readers see it, and the fixed binary header used to store it.

The header is plain ``struct`` data (never pickle), shared by every format that stores samples
as opaque values (LMDB today): label, encoding, shape and a CRC32 of the image bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

from readers.errors import ChecksumError

Buffer = bytes | bytearray | memoryview

ENCODING_CODES = {"jpeg": 1, "png": 2, "raw": 3, "bmp": 4, "original": 5}
ENCODING_NAMES = {code: name for name, code in ENCODING_CODES.items()}

# label:int32, encoding:uint8, channels:uint8, reserved:uint16, height:uint32, width:uint32, crc32:uint32
HEADER = struct.Struct("<iBBHIII")


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


def crc32(data: Buffer) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def pack_record(data: Buffer, label: int, height: int, width: int, channels: int, encoding: str) -> bytes:
    header = HEADER.pack(label, ENCODING_CODES[encoding], channels, 0, height, width, crc32(data))
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
    if verify and crc32(data) != checksum:
        raise ChecksumError(
            f"{_name(where)}: image bytes do not match their checksum; the dataset is corrupt"
        )
    return Record(data, label, height, width, channels, ENCODING_NAMES.get(code, "original"))
