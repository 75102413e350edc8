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

from readers.errors import ChecksumError
from readers.store.checksums import crc32

Buffer = bytes | bytearray | memoryview

ENCODING_CODES = {"jpeg": 1, "png": 2, "raw": 3, "bmp": 4, "original": 5}
ENCODING_NAMES = {code: name for name, code in ENCODING_CODES.items()}

# label:int32, encoding:uint8, channels:uint8, flags:uint16, height:uint32, width:uint32, crc32:uint32
HEADER = struct.Struct("<iBBHIII")
# flags bit 0: the bytes end with the sample's fields (canonical JSON) and their uint32 length,
# inside the region the CRC32 covers.
HAS_FIELDS = 1
FIELDS_LENGTH = struct.Struct("<I")
CHECKED = struct.Struct("<iBBHII")  # the header fields the CRC32 covers (all but the CRC itself)


class Record(NamedTuple):
    """Encoded (or raw) image bytes plus what is needed to decode and label them."""

    data: Buffer
    label: int
    height: int
    width: int
    channels: int
    encoding: str
    # The sample's fields beyond the label (readers/fields/field_schema.py): as stored (canonical JSON bytes)
    # from the reader, typed values ({name: value}) once FormatReader.read_block has decoded them.
    fields: Buffer | dict | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.channels)


def _name(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


def record_crc(
    data: Buffer, label: int, height: int, width: int, channels: int, encoding: str,
    fields: Buffer | dict | None = b"",
) -> int:
    """CRC32 of a sample's label, encoding and shape followed by its image bytes (and its stored
    fields, when it has any)."""
    header = CHECKED.pack(label, ENCODING_CODES[encoding], channels, 0, height, width)
    checksum = crc32(data, crc32(header))
    if isinstance(fields, (bytes, bytearray, memoryview)) and len(fields):
        return crc32(fields, checksum)
    return checksum


def pack_record(
    data: Buffer, label: int, height: int, width: int, channels: int, encoding: str, fields: bytes = b""
) -> bytes:
    flags = HAS_FIELDS if fields else 0
    body = bytes(data) + fields + FIELDS_LENGTH.pack(len(fields)) if fields else bytes(data)
    checked = CHECKED.pack(label, ENCODING_CODES[encoding], channels, flags, height, width)
    checksum = crc32(body, crc32(checked))
    return HEADER.pack(label, ENCODING_CODES[encoding], channels, flags, height, width, checksum) + body


def unpack_record(value: Buffer, verify: bool = False, where: str | Callable[[], str] = "record") -> Record:
    """Split a stored value into a Record without copying the image bytes.

    ``where`` names the record in error messages; pass a callable on hot paths so the name is
    only formatted when there is an error.
    """
    view = memoryview(value)
    if len(view) < HEADER.size:
        raise ChecksumError(f"{_name(where)}: value of {len(view)} bytes is shorter than the record header")
    label, code, channels, flags, height, width, checksum = HEADER.unpack_from(view)
    data = view[HEADER.size :]
    if verify and crc32(data, crc32(view[: CHECKED.size])) != checksum:
        raise ChecksumError(
            f"{_name(where)}: label, shape or image bytes do not match their checksum; the dataset is corrupt"
        )
    fields = None
    if flags & HAS_FIELDS:
        if len(data) < FIELDS_LENGTH.size:
            raise ChecksumError(f"{_name(where)}: the record's fields are cut off; the dataset is corrupt")
        (length,) = FIELDS_LENGTH.unpack_from(data, len(data) - FIELDS_LENGTH.size)
        end = len(data) - FIELDS_LENGTH.size
        if length > end:
            raise ChecksumError(f"{_name(where)}: the record's fields are cut off; the dataset is corrupt")
        data, fields = data[: end - length], data[end - length : end]
    return Record(data, label, height, width, channels, ENCODING_NAMES.get(code, "original"), fields)
