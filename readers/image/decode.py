"""CPU decoding of records, fastest decoder first, and the output kinds.

JPEG: simplejpeg (libjpeg-turbo, releases the GIL), then OpenCV, then Pillow for anything the
fast paths reject (CMYK, odd subsampling, corrupt-but-readable files). PNG: OpenCV, then Pillow.
Raw pixels are a zero-copy ``np.frombuffer``. BMP is parsed with NumPy (readers.image.bmpcodec).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from readers.errors import DecodeError, ImgpackError, OptionError
from readers.store.record import Record

OUTPUT_KINDS = ("pil", "numpy", "tensor", "bytes")

try:
    import simplejpeg
except ImportError:  # pragma: no cover - simplejpeg is a hard dependency, kept optional here
    simplejpeg = None

try:
    import cv2

    cv2.setNumThreads(1)  # decode runs in many worker processes already
except ImportError:
    cv2 = None  # type: ignore[assignment]


def sniff(data: Any) -> str:
    head = bytes(data[:8])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:2] == b"BM":
        return "bmp"
    return "other"


def jpeg_size(data: Any) -> tuple[int, int] | None:
    """(height, width) from a JPEG's header: simplejpeg's parser, else Pillow's (the decoder the
    fast path falls back to); None where neither reads it (the decode that follows names why)."""
    if simplejpeg is not None:
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            return height, width
        except (ValueError, KeyError):  # KeyError: a sampling it has no name for (4:4:1)
            pass
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as img:
            width, height = img.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return height, width


def _to_rgb(array: np.ndarray, channels: int) -> np.ndarray:
    """Make a decoder's output HWC with ``channels`` (1 or 3) channels."""
    if array.ndim == 2:
        array = array[:, :, None]
    if channels == 3 and array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    elif channels == 1 and array.shape[2] == 3:
        from PIL import Image

        array = np.asarray(Image.fromarray(array).convert("L"))[:, :, None]
    return array


def _pillow(data: Any, channels: int) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(bytes(data))) as img:
        return _to_rgb(np.asarray(img.convert("L" if channels == 1 else "RGB")), channels)


def _jpeg(data: Any, channels: int) -> np.ndarray:
    if simplejpeg is not None:
        try:
            return simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB")
        except ValueError:
            pass  # e.g. CMYK or unusual sampling: let a general decoder try
    return _opencv_or_pillow(data, channels)


def _opencv_or_pillow(data: Any, channels: int) -> np.ndarray:
    if cv2 is not None:
        flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
        array = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flag | cv2.IMREAD_IGNORE_ORIENTATION)
        if array is not None:
            if channels == 3:
                array = cv2.cvtColor(array, cv2.COLOR_BGR2RGB)
            return _to_rgb(array, channels)
    return _pillow(data, channels)


def _bmp(data: Any, channels: int) -> np.ndarray:
    from readers.image.bmpcodec import decode_bmp

    return _to_rgb(decode_bmp(data), channels)


def _by_content(data: Any, channels: int) -> np.ndarray:
    return DECODERS.get(sniff(data), _pillow)(data, channels)


DECODERS: dict[str, Callable[[Any, int], np.ndarray]] = {
    "jpeg": _jpeg,
    "png": _opencv_or_pillow,
    "bmp": _bmp,
    "other": _pillow,
}


def check_decode_kind(kind: str) -> str:
    """``kind`` if it is one of ``OUTPUT_KINDS`` (the one place that says so), else ``OptionError``."""
    if kind not in OUTPUT_KINDS:
        raise OptionError(f"decode={kind!r} is an unknown decode kind; use one of {', '.join(OUTPUT_KINDS)}")
    return kind


def decode_array(record: Record) -> np.ndarray:
    """The record's image as an HWC uint8 array (RGB, or one channel for grayscale datasets).

    Any decoder failure is a ``DecodeError``; callers that know the sample add where it is.
    """
    try:
        return _decode_array(record)
    except ImgpackError:
        raise
    except Exception as exc:  # each decoder fails its own way; all mean "corrupt"
        raise DecodeError(
            f"{record.encoding} image bytes do not decode ({type(exc).__name__}: {exc}); "
            "the dataset is corrupt, run `pack verify` and re-pack"
        ) from None


def naming_decode_errors(items: Iterator[Any], reader: Any, indices: Any, records: list) -> Iterator[Any]:
    """``items``, with a ``DecodeError`` raised while producing them re-raised naming its sample.

    ``records`` are the records being decoded and ``indices`` their global sample indices; on
    an error (rare) they are decoded one by one to find the failing sample.
    """
    try:
        yield from items
    except DecodeError as exc:
        for index, record in zip(np.asarray(indices).tolist(), records):
            try:
                _decode_array(record)
            except Exception:  # this is the failing sample
                raise DecodeError(f"{reader.describe(index)}: {exc}") from None
        raise


def _decode_array(record: Record) -> np.ndarray:
    channels = record.channels or 3
    if record.encoding == "raw":
        return np.frombuffer(record.data, dtype=np.uint8).reshape(record.height, record.width, channels)
    if record.encoding == "original":
        return _by_content(record.data, channels)
    decoder = DECODERS.get(record.encoding, _by_content)
    return decoder(record.data, channels)


def to_output(array: np.ndarray, kind: str) -> Any:
    if kind == "numpy":
        return array
    if kind == "tensor":
        import torch

        if not array.flags.writeable:
            array = array.copy()  # torch needs writable memory; raw records are read-only views
        return torch.from_numpy(array).permute(2, 0, 1)
    if kind == "pil":
        from PIL import Image

        return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    check_decode_kind(kind)
    raise AssertionError(kind)  # every kind is handled above


def decode_record(record: Record, kind: str = "pil") -> Any:
    """Decode a record to ``kind``: pil, numpy (HWC uint8), tensor (CHW uint8) or bytes."""
    if kind == "bytes":
        return bytes(record.data)
    return to_output(decode_array(record), check_decode_kind(kind))
