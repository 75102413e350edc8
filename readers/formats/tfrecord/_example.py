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

import numpy as np

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


def _text_bytes(text: str) -> bytes:
    # A file name that is not UTF-8 reaches us with its bytes escaped as surrogates (as Python's
    # os functions decode it): store those original bytes, as tar and lmdb keep the name.
    return text.encode("utf-8", "surrogateescape")


def encode_feature(value: FeatureValue) -> bytes:
    """A ``Feature``: bytes/str -> bytes_list, int -> int64_list, float -> float_list; lists too."""
    from readers.formats.tfrecord._fields import Floats, Ints

    if isinstance(value, Floats):
        return _field(2, _field(1, _float32_bytes(value)))
    if isinstance(value, Ints):
        return _field(3, _field(1, b"".join(varint(v) for v in value)))
    values: list[object] = list(value) if isinstance(value, (list, tuple)) else [value]
    texts = [v for v in values if isinstance(v, (bytes, bytearray, memoryview, str))]
    if len(texts) == len(values):
        items = b"".join(_field(1, _text_bytes(v) if isinstance(v, str) else bytes(v)) for v in texts)
        return _field(1, items)
    ints = [v for v in values if isinstance(v, int)]
    if len(ints) == len(values):
        return _field(3, _field(1, b"".join(varint(v) for v in ints)))
    if all(isinstance(v, float) for v in values):
        return _field(2, _field(1, _float32_bytes(values)))
    raise TypeError(f"cannot store {value!r} in a tf.train.Example feature (bytes, str, int or float)")


def _float32_bytes(values: Sequence[object]) -> bytes:
    """A float_list's packed values: float32, as TensorFlow has it; a value beyond its range is
    an infinity there (imgpack keeps the exact float64 in ``imgpack/fields``), not an error."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype="<f4").tobytes()


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
        value: int | memoryview
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


def _varint_at(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """``_read_varint`` with the one-byte case (tags, small lengths) inline."""
    if pos < end and view[pos] < 0x80:
        return view[pos], pos + 1
    return _read_varint(view, pos, end)


def _fast_feature(view: memoryview) -> list | None:
    """One bytes value or packed int64 values laid out as TensorFlow writes them, else None."""
    end = len(view)
    if end < 2 or view[0] not in (0x0A, 0x1A):  # bytes_list / int64_list, length-delimited
        return None
    size, pos = _varint_at(view, 1, end)
    if pos + size != end or pos >= end or view[pos] != 0x0A:  # value = 1, length-delimited
        return None
    length, pos = _varint_at(view, pos + 1, end)
    if pos + length != end:
        return None
    if view[0] == 0x0A:
        return [view[pos:end]]
    values = []
    while pos < end:
        value, pos = _varint_at(view, pos, end)
        values.append(_signed(value))
    return values


def decode_feature(view: memoryview) -> list:
    """The values of a ``Feature``: memoryviews (bytes_list), ints (int64_list) or floats."""
    fast = _fast_feature(view)
    if fast is not None:
        return fast
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


def _skip(view: memoryview, key: int, pos: int, end: int) -> int:
    """Position after the value of a field with tag ``key`` that is not wanted."""
    wire = key & 7
    if wire == VARINT:
        return _varint_at(view, pos, end)[1]
    if wire == LEN:
        size, pos = _varint_at(view, pos, end)
        return pos + size
    if wire in (FIXED64, FIXED32):
        return pos + (8 if wire == FIXED64 else 4)
    raise ExampleError(f"unsupported wire type {wire} for field {key >> 3}")


def leading_entries(data: Buffer, count: int) -> list[tuple[bytes, memoryview]]:
    """The first ``count`` (name, Feature) entries of a serialized ``Example``, in file order,
    without walking the rest: a reader that knows what its writer put first stops early."""
    view = memoryview(data)
    end = len(view)
    if end < 2 or view[0] != 0x0A:
        return []
    size, pos = _varint_at(view, 1, end)
    features_end = min(end, pos + size)
    out: list[tuple[bytes, memoryview]] = []
    try:
        while pos < features_end and len(out) < count:
            if view[pos] != 0x0A:
                return out
            size, pos = _varint_at(view, pos + 1, features_end)
            entry_end = pos + size
            if entry_end > features_end or view[pos] != 0x0A:
                return out
            size, pos = _varint_at(view, pos + 1, entry_end)
            name, pos = bytes(view[pos : pos + size]), pos + size
            if pos >= entry_end or view[pos] != 0x12:
                return out
            size, pos = _varint_at(view, pos + 1, entry_end)
            if pos + size != entry_end:
                return out
            out.append((name, view[pos:entry_end]))
            pos = entry_end
    except (IndexError, ExampleError):
        return out
    return out


def decode_example(data: Buffer, wanted: frozenset[bytes] | None = None) -> dict[str, list]:
    """Feature name -> values of a serialized ``Example`` (bytes values are zero-copy views).

    ``wanted`` (names as bytes) limits decoding to those features; the others are skipped. The
    three message levels above a feature are walked inline: this runs once per record read.
    """
    view = memoryview(data)
    out: dict[str, list] = {}
    pos, end = 0, len(view)
    try:
        while pos < end:
            key, pos = _varint_at(view, pos, end)
            if key != 0x0A:  # Example.features
                pos = _skip(view, key, pos, end)
                continue
            size, pos = _varint_at(view, pos, end)
            features_end = pos + size
            while pos < features_end:
                key, pos = _varint_at(view, pos, features_end)
                if key != 0x0A:  # Features.feature (a map entry)
                    pos = _skip(view, key, pos, features_end)
                    continue
                size, pos = _varint_at(view, pos, features_end)
                entry_end = pos + size
                name, value = b"", None
                while pos < entry_end:
                    key, pos = _varint_at(view, pos, entry_end)
                    if key == 0x0A or key == 0x12:  # entry key / entry value
                        size, pos = _varint_at(view, pos, entry_end)
                        if key == 0x0A:
                            name = bytes(view[pos : pos + size])
                        else:
                            value = view[pos : pos + size]
                        pos += size
                    else:
                        pos = _skip(view, key, pos, entry_end)
                if pos != entry_end or entry_end > features_end:
                    raise ExampleError("a feature entry runs past the end of its message")
                if wanted is None or name in wanted:
                    out[name.decode("utf-8")] = decode_feature(value) if value is not None else []
            if pos != features_end or features_end > end:
                raise ExampleError("the features run past the end of the example")
    except UnicodeDecodeError as exc:
        raise ExampleError(f"feature name is not UTF-8 ({exc})") from None
    except IndexError:
        raise ExampleError("truncated message") from None
    return out
