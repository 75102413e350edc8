"""``tf.train.Example`` in the protobuf wire format, encoded and parsed by hand.

The schema is four tiny messages (tensorflow/core/example/{example,feature}.proto):
``Example{Features features = 1}``, ``Features{map<string, Feature> feature = 1}``,
``Feature{oneof kind {BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3}}``,
each list ``{repeated <type> value = 1}`` (int64 and float packed). A map is a repeated entry
message ``{string key = 1; Feature value = 2}``.

Written by hand rather than through the ``protobuf`` package because that package has no
``Example`` class without TensorFlow or generated code (protoc), and because the parser here
returns zero-copy ``memoryview`` slices of the record for the image bytes (a protobuf message
copies every bytes field). The ``tfrecord`` package's generated ``example_pb2`` parses what we
write in the tests, so the encoding is checked against an independent implementation.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

Buffer = bytes | bytearray | memoryview
FeatureValue = bytes | int | float | str | Sequence[int] | Sequence[bytes]

LEN = 2  # wire type of length-delimited fields
VARINT = 0
FIXED64, FIXED32 = 1, 5


class ExampleError(ValueError):
    """The bytes are not a well-formed ``tf.train.Example``."""


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 is sent as its two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | LEN) + varint(len(payload)) + payload


def encode_feature(value: FeatureValue) -> bytes:
    """A ``Feature``: bytes/str -> bytes_list, int -> int64_list, float -> float_list; lists too."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in values):
        items = b"".join(_field(1, v.encode("utf-8") if isinstance(v, str) else bytes(v)) for v in values)
        return _field(1, items)
    if all(isinstance(v, int) for v in values):
        return _field(3, _field(1, b"".join(varint(v) for v in values)))
    if all(isinstance(v, float) for v in values):
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
    raise TypeError(f"cannot store {value!r} in a tf.train.Example feature (bytes, str, int or float)")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """The serialized ``Example`` holding ``features`` (entries in the mapping's order)."""
    entries = b"".join(
        _field(1, _field(1, name.encode("utf-8")) + _field(2, encode_feature(value)))
        for name, value in features.items()
    )
    return _field(1, entries)


def _read_varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ExampleError("truncated or overlong varint")


def fields(view: memoryview, pos: int = 0, end: int | None = None):
    """``(field number, wire type, value)`` of a message: ints for varints, memoryviews for LEN."""
    end = len(view) if end is None else end
    while pos < end:
        key, pos = _read_varint(view, pos, end)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _read_varint(view, pos, end)
        elif wire == LEN:
            size, pos = _read_varint(view, pos, end)
            if pos + size > end:
                raise ExampleError(f"field {number} runs past the end of its message")
            value, pos = view[pos : pos + size], pos + size
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            value, pos = view[pos : pos + size], pos + size
        else:
            raise ExampleError(f"unsupported wire type {wire} for field {number}")
        if pos > end:
            raise ExampleError(f"field {number} runs past the end of its message")
        yield number, wire, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_feature(view: memoryview) -> list:
    """The values of a ``Feature``: memoryviews (bytes_list), ints (int64_list) or floats."""
    for kind, _, payload in fields(view):
        values: list = []
        for number, wire, item in fields(payload):
            if number != 1:
                continue
            if kind == 1:
                values.append(item)
            elif kind == 3 and wire == LEN:  # packed
                pos = 0
                while pos < len(item):
                    value, pos = _read_varint(item, pos, len(item))
                    values.append(_signed(value))
            elif kind == 3:
                values.append(_signed(item))
            elif kind == 2 and wire == LEN:
                values.extend(struct.unpack(f"<{len(item) // 4}f", item))
            elif kind == 2:
                values.append(struct.unpack("<f", item)[0])
        return values
    return []


def decode_example(data: Buffer) -> dict[str, list]:
    """Feature name -> values of a serialized ``Example`` (bytes values are zero-copy views)."""
    view = memoryview(data)
    out: dict[str, list] = {}
    try:
        for number, wire, features in fields(view):
            if number != 1 or wire != LEN:
                continue
            for entry_number, entry_wire, entry in fields(features):
                if entry_number != 1 or entry_wire != LEN:
                    continue
                name, value = "", None
                for part, part_wire, payload in fields(entry):
                    if part == 1 and part_wire == LEN:
                        name = bytes(payload).decode("utf-8")
                    elif part == 2 and part_wire == LEN:
                        value = payload
                out[name] = decode_feature(value) if value is not None else []
    except UnicodeDecodeError as exc:
        raise ExampleError(f"feature name is not UTF-8 ({exc})") from None
    return out
