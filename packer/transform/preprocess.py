"""The offline transform applied once per image: decode, orient, convert, resize, crop, encode.

``PreprocessSpec`` (readers/formats/packed_sample.py) describes it completely and is stored in the
manifest, so a dataset records exactly how it was made. ``preprocess_file`` turns one source file
into a ``PackedSample`` or raises ``SkipSample`` with a reason a person can act on.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from dataclasses import replace

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from readers.formats.packed_sample import AUTO_RESAMPLE, PILLOW_RESAMPLERS, PackedSample, PreprocessSpec
from readers.image import resample
from readers.image.geometry import centre_window, resized_size, round_size
from readers.store.sample_hashes import digest_of, phash_of_image

try:
    import simplejpeg
except ImportError:  # pragma: no cover
    simplejpeg = None

# Pillow's filter of each ``--resample`` name but "auto" (the readers' resampler).
RESAMPLE = {name: Image.Resampling[name.upper()] for name in PILLOW_RESAMPLERS}
ORIENTATION_SWAPS_AXES = {5, 6, 7, 8}
# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose).
ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


class SkipSample(Exception):
    """This source file cannot be packed; the message is the reason recorded in ``skipped``."""


def resized_size_of(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int]:
    """(width, height) after ``--resize`` alone (never larger unless ``--upscale`` or exact): the
    readers' size rule (``readers.image.geometry.resized_size``, (h, w) order) with the packer's modes."""
    if not spec.resize:
        return width, height
    n = spec.resize
    if spec.resize_mode == "exact":
        return n, n
    shorter = spec.resize_mode == "shorter"
    h, w = resized_size(height, width, n, longer=not shorter)
    if not spec.upscale and h * w > width * height:
        return width, height
    return w, h


def target_size(width: int, height: int, spec: PreprocessSpec) -> tuple[int, int]:
    """(width, height) after the resize step (before the crop), enlarged to cover the crop when
    the image is smaller than it (the packer only gets there with ``--upscale``; it skips such
    images otherwise, see ``check_crop_fits``)."""
    width, height = resized_size_of(width, height, spec)
    if spec.crop and (width < spec.crop or height < spec.crop):
        # A crop demands a fixed size: scale a small image up just enough to cover it.
        scale = spec.crop / min(width, height)
        width, height = max(spec.crop, round_size(width * scale)), max(spec.crop, round_size(height * scale))
    return width, height


def check_crop_fits(width: int, height: int, spec: PreprocessSpec) -> None:
    """Without ``--upscale`` nothing is enlarged, so an image smaller than the crop is skipped."""
    if not spec.crop or spec.upscale:
        return
    width, height = resized_size_of(width, height, spec)
    if width < spec.crop or height < spec.crop:
        raise SkipSample(
            f"smaller than --crop {spec.crop} and nothing is enlarged without --upscale; "
            "pass --upscale to enlarge such images, or a smaller --crop"
        )


def resize_image(img: Image.Image, size: tuple[int, int], resample_name: str) -> Image.Image:
    """``img`` resized to ``size`` (width, height): the readers' resampler for ``auto``."""
    if resample_name != AUTO_RESAMPLE:
        return img.resize(size, RESAMPLE[resample_name])
    width, height = size
    return Image.fromarray(resample.resize(np.asarray(img), (height, width)))


def _to_8bit_mode(img: Image.Image, mode: str) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB or L, scaling 16-bit data and flattening alpha on white."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        array = np.asarray(img)
        # 16-bit PNG/TIFF data uses 0..65535 ("I" is how Pillow holds some of them): keep the high
        # byte, as Pillow does for 16-bit RGB(A) and LA, whatever the image's own maximum is.
        array = np.clip(array.astype(np.int64) >> 8, 0, 255)
        img = Image.fromarray(array.astype(np.uint8), "L")
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img if img.mode == mode else img.convert(mode)


def _centre_crop(img: Image.Image, size: int) -> Image.Image:
    top, left, h, w = centre_window(img.height, img.width, (size, size))
    return img.crop((left, top, left + w, top + h))


def _encode(img: Image.Image, spec: PreprocessSpec) -> bytes:
    if spec.encode == "raw":
        return img.tobytes()
    if spec.encode == "jpeg":
        if simplejpeg is not None:
            array = np.asarray(img)
            if img.mode == "L":
                array = array[:, :, None]
            return simplejpeg.encode_jpeg(
                np.ascontiguousarray(array),
                quality=spec.quality,
                colorspace="GRAY" if img.mode == "L" else "RGB",
                colorsubsampling="420",
            )
        buffer = io.BytesIO()
        img.save(buffer, format="JPEG", quality=spec.quality)
        return buffer.getvalue()
    buffer = io.BytesIO()
    if spec.encode == "png":
        img.save(buffer, format="PNG", compress_level=3)
    else:
        from readers.image.bmpcodec import encode_bmp

        return encode_bmp(np.asarray(img))
    return buffer.getvalue()


def _read_file(path: str) -> bytes:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SkipSample("not a regular file (a pipe, socket or device); remove it from the folder")
        with open(path, "rb") as fh:
            return fh.read()
    except PermissionError:
        raise SkipSample("permission denied; make the file readable") from None
    except OSError as exc:
        raise SkipSample(f"cannot read the file ({exc.strerror})") from None


def _open_checked(path: str, spec: PreprocessSpec, raw: bytes | None = None) -> tuple[Image.Image, bytes]:
    if raw is None:
        raw = _read_file(path)
    if not raw:
        raise SkipSample("empty file (0 bytes)")
    Image.MAX_IMAGE_PIXELS = spec.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise SkipSample(
            f"image is larger than the decompression-bomb limit of {spec.max_pixels} pixels; "
            "raise it with --max-pixels if the file is trusted"
        ) from None
    except UnidentifiedImageError:
        raise SkipSample("not an image Pillow can identify (wrong extension or corrupt header)") from None
    except Exception as exc:  # any decoder failure is a skip, never a crash
        raise SkipSample(f"cannot open image: {exc}") from None
    return img, raw


def _decode_jpeg_scaled(raw: bytes, size: tuple[int, int], mode: str) -> Image.Image | None:
    """Decode a JPEG with libjpeg-turbo's DCT-domain scaling (any of its 1/8 steps) to at least
    ``size`` (width, height), so the resize that follows works on far fewer pixels; ``None``
    when the fast decoder refuses the file (CMYK, corrupt...), which then goes through Pillow."""
    if simplejpeg is None:
        return None
    try:
        array = simplejpeg.decode_jpeg(
            raw, colorspace="GRAY" if mode == "L" else "RGB", min_width=size[0], min_height=size[1]
        )
    except ValueError:
        return None
    return Image.fromarray(array[:, :, 0] if mode == "L" else array)


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image; 1 without one, or for a value outside 1-8
    (which ``ImageOps.exif_transpose`` ignores too)."""
    value = img.getexif().get(0x0112, 1) if hasattr(img, "getexif") else 1
    return value if value in ORIENTATION_TRANSPOSE else 1


def preprocess_image(
    img: Image.Image, raw: bytes, spec: PreprocessSpec
) -> tuple[Image.Image | None, tuple[int, int]]:
    """Apply orientation, mode, resize and crop; ``None`` image for encode=original, unless the
    source is EXIF-rotated: then its upright pixels (stored losslessly, see ``preprocess_file``)."""
    orientation = exif_orientation(img)
    width, height = img.size
    if orientation in ORIENTATION_SWAPS_AXES:
        width, height = height, width
    original_size = (width, height)
    if spec.encode == "original":
        img.load()  # decode fully: a truncated or corrupt file is skipped, not packed
        if orientation == 1:
            return None, original_size
        return _to_8bit_mode(ImageOps.exif_transpose(img), "RGB"), original_size
    check_crop_fits(width, height, spec)
    out_w, out_h = target_size(width, height, spec)
    if out_w * out_h > spec.max_pixels:
        # refused before any pixel is allocated: a 1x60000 strip made to cover --crop 224 is
        # 224 x 13.4 million pixels
        raise SkipSample(
            f"enlarging {width}x{height} to {out_w}x{out_h} ({out_w * out_h:,} pixels) exceeds the "
            f"--max-pixels limit of {spec.max_pixels:,}; such a thin image is rarely a real sample "
            "(drop --upscale, or raise --max-pixels)"
        )
    stored_target = (out_h, out_w) if orientation in ORIENTATION_SWAPS_AXES else (out_w, out_h)
    scaled = None
    if img.format == "JPEG" and img.mode in ("RGB", "L") and (out_w < width or out_h < height):
        scaled = _decode_jpeg_scaled(raw, stored_target, spec.mode)
    if scaled is not None:
        transpose = ORIENTATION_TRANSPOSE.get(orientation)
        img = scaled.transpose(transpose) if transpose is not None else scaled
    else:
        if img.format == "JPEG" and (out_w * 2 <= width or out_h * 2 <= height):
            # DCT-domain downscaling by Pillow: 1/2, 1/4 or 1/8, never below the target.
            img.draft(img.mode if img.mode in ("RGB", "L") else None, stored_target)
        img.load()
        img = ImageOps.exif_transpose(img) if orientation != 1 else img
        img = _to_8bit_mode(img, spec.mode)
    if img.size != (out_w, out_h):
        img = resize_image(img, (out_w, out_h), spec.resample)
    if spec.crop:
        img = _centre_crop(img, spec.crop)
    return img, original_size


def preprocess_file(
    path: str, rel: str, label: int, source_index: int, spec: PreprocessSpec, raw: bytes | None = None
) -> PackedSample:
    """``path`` preprocessed (its bytes ``raw`` when the caller has read them already)."""
    img, raw = _open_checked(path, spec, raw)
    orientation = exif_orientation(img)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. Pillow's "palette images with transparency" notes
            out, original_size = preprocess_image(img, raw, spec)
            if out is None:
                kept = PackedSample(
                    source_index, rel, label, raw, *original_size[::-1], 3, "original", original_size
                )
                return _hashed(kept, phash_of_image(img))
            # An EXIF-rotated original is stored upright as PNG (lossless: the pixels every other
            # encoding starts from), since readers and peers decode bytes without EXIF.
            data = _encode(out, replace(spec, encode="png") if spec.encode == "original" else spec)
            phash = phash_of_image(out)  # where the pixels are, before ``img`` is closed
    except SkipSample:
        raise
    except Exception as exc:  # truncated data, broken chunks, decoder errors, memory
        raise SkipSample(f"cannot decode image: {str(exc) or type(exc).__name__}") from None
    finally:
        img.close()
    resized = target_size(*original_size, spec)
    upscaled = resized[0] * resized[1] > original_size[0] * original_size[1]
    sample = PackedSample(
        source_index,
        rel,
        label,
        data,
        out.height,
        out.width,
        spec.channels,
        spec.encode,
        original_size,
        upscaled,
        orientation=orientation,
    )
    return _hashed(sample, phash)


def _hashed(sample: PackedSample, phash: int) -> PackedSample:
    """``sample`` with its hashes: the perceptual one of the pixels it stores (computed here, in
    the worker that has them), the exact one of its bytes."""
    sample.digest = digest_of(sample.data)
    sample.phash = phash
    return sample
