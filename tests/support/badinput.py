"""Build a corpus of good, odd and broken inputs for packer tests (a helper, not a test file).

``make_bad_corpus(root)`` writes an ImageFolder-style tree ``root/<class>/<file>`` made
from the real photographs in ``sample_data/`` and returns ``{relative posix path:
expected outcome}`` for every file it created. The outcomes are:

``"ok"``
    an image candidate that a correct packer must pack (one sample each);
``"skip"``
    an image candidate (image extension, not hidden) that cannot be decoded safely:
    a correct packer must not crash or abort the whole run, must not pack it, and
    must list it as skipped (with a reason);
``"ignore"``
    not an image candidate at all (hidden file or non-image extension): a correct
    packer must neither pack it nor report it as skipped.

The tree (``OK``/``SKIP``/``IGNORE`` = expected outcome)::

    good/astronaut.jpg              OK    baseline RGB JPEG
    good/chelsea.png                OK    RGB PNG
    good/grace_hopper_exif6.jpg     OK    EXIF Orientation 6: the stored pixels are rotated;
                                          after ImageOps.exif_transpose it is upright
                                          (portrait, 420x492)
    good/UPPER CASE.JPEG            OK    upper-case extension and a space in the name
    good/.DS_Store                  IGNORE  hidden file (macOS junk, not an image)
    good/.hidden.jpg                IGNORE  hidden file, although it is a valid JPEG
    good/notes.txt                  IGNORE  non-image extension
    café crème/tasse à café.jpg     OK    non-ASCII and spaces in class and file name
                                          (names written NFC-normalised)
    café crème/naïve_portrait.jpg   OK    second file of that class (portrait)
    formats/cmyk.jpg                OK    CMYK JPEG: convert to RGB
    formats/grayscale.jpg           OK    8-bit grayscale (L) JPEG: convert to RGB
    formats/progressive.jpg         OK    progressive JPEG
    formats/png_named.jpg           OK    PNG data behind a .jpg extension: sniff content,
                                          do not trust the extension
    formats/rgba.png                OK    RGBA PNG (photo with a soft alpha mask)
    formats/palette_transparency.png OK   palette (P) PNG with a transparent index (tRNS)
    formats/gray16.png              OK    16-bit grayscale PNG (Pillow mode I;16) whose
                                          values span the full 0..65535 range: must be
                                          scaled to 8 bits (>> 8), not clipped
    formats/rgb16.png               OK    16-bit-per-channel RGB PNG (48-bit)
    formats/animated.gif            OK    animated GIF, 3 different frames: pack frame 0
    formats/multipage.tif           OK    2-page TIFF, different pages: pack page 0
    broken/truncated.jpg            SKIP  a real JPEG cut to 60% of its bytes (Pillow raises
                                          "image file is truncated" on load); a packer that
                                          stores raw bytes must still decode-check them
    broken/empty.jpg                SKIP  zero bytes
    broken/text.jpg                 SKIP  plain text behind a .jpg extension
    broken/bomb.png                 SKIP  valid 1-bit PNG that declares 16384x16384 pixels
                                          (> 2 * Image.MAX_IMAGE_PIXELS): Pillow raises
                                          DecompressionBombError on open; about 33 KB on disk
    broken/unreadable.jpg           SKIP  a valid JPEG with mode 000 (chmod 0). As root the
                                          permission bits are not enforced and the file reads
                                          fine: then the expected outcome is OK. The returned
                                          dict already holds the right one; see
                                          permissions_effective().
    empty_class/                          an empty class folder (no file; not in the dict).
                                          A packer must not crash on it; whether the class
                                          name still appears in its class list is its own
                                          policy (torchvision's ImageFolder needs
                                          allow_empty=True to keep it).

Helpers: ``permissions_effective``, ``expected_image`` (the reference decode of an "ok"
file), ``by_outcome``, ``SAMPLE_DATA``, ``EMPTY_CLASS``, ``UNREADABLE``.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import unicodedata
import zlib
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageOps

__all__ = [
    "EMPTY_CLASS",
    "IGNORE",
    "OK",
    "SAMPLE_DATA",
    "SKIP",
    "UNREADABLE",
    "by_outcome",
    "expected_image",
    "make_bad_corpus",
    "permissions_effective",
]

OK = "ok"
SKIP = "skip"
IGNORE = "ignore"

SAMPLE_DATA = Path(__file__).resolve().parents[2] / "sample_data"
EMPTY_CLASS = "empty_class"
UNREADABLE = "broken/unreadable.jpg"
BOMB_SIDE = 16384  # 16384**2 = 268M pixels > 2 * 89_478_485 (Pillow's default limit)


def _nfc(rel: str) -> str:
    return unicodedata.normalize("NFC", rel)


def _photo(name: str, source: Path) -> Image.Image:
    """Open a sample photo (upright, fully loaded)."""
    with Image.open(source / name) as im:
        im.load()
        return ImageOps.exif_transpose(im)


def _rgb(name: str, source: Path) -> Image.Image:
    return _photo(name, source).convert("RGB")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _write_png16_rgb(path: Path, arr: np.ndarray) -> None:
    """Write an (H, W, 3) uint16 array as a 48-bit RGB PNG (Pillow cannot write one)."""
    h, w, _ = arr.shape
    body = arr.astype(">u2").view(np.uint8).reshape(h, w * 6)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), body], axis=1).tobytes()  # filter 0
    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(raw, 6))
        + _png_chunk(b"IEND", b"")
    )


def _write_bomb_png(path: Path, side: int = BOMB_SIDE) -> None:
    """Write a valid, all-black 1-bit PNG of side x side pixels (tens of KB, well under 1 s)."""
    row = b"\x00" * (1 + (side + 7) // 8)  # filter byte + packed bits
    comp = zlib.compressobj(9)
    block = row * 256
    parts = [comp.compress(block) for _ in range(side // 256)]
    parts.append(comp.compress(row * (side % 256)))
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", b"".join(parts))
        + _png_chunk(b"IEND", b"")
    )


def _to_full_range_u16(x: np.ndarray) -> np.ndarray:
    """Stretch a float array linearly onto 0..65535 (min -> 0, max -> 65535)."""
    x = x.astype(np.float64)
    lo, hi = float(x.min()), float(x.max())
    return np.round((x - lo) * (65535.0 / max(hi - lo, 1e-9))).astype(np.uint16)


def _float_channel(band: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """Resize one 8-bit band in float mode, so the result holds in-between values."""
    return np.asarray(band.convert("F").resize(size, Image.Resampling.BICUBIC))


def permissions_effective(directory: Path | None = None) -> bool:
    """True if a file with mode 000 cannot be opened by this process (false as root)."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        probe = Path(tmp) / "probe"
        probe.write_bytes(b"x")
        probe.chmod(0)
        try:
            with probe.open("rb"):
                return False
        except PermissionError:
            return True
        finally:
            probe.chmod(0o600)


def make_bad_corpus(root: Path, source: Path = SAMPLE_DATA) -> dict[str, str]:
    """Create the corpus described in the module docstring under ``root``.

    Args:
        root: folder to fill (created if missing; should be empty).
        source: the sample photo folder (default: the repository's ``sample_data``).

    Returns:
        ``{posix path relative to root: "ok" | "skip" | "ignore"}`` for every file
        created. ``broken/unreadable.jpg`` maps to "skip" when permission bits are
        effective for this process, else (e.g. as root) to "ok".
    """
    root = Path(root)
    source = Path(source)
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}

    def dest(rel: str) -> Path:
        rel = _nfc(rel)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def copy(src: str, rel: str, outcome: str) -> None:
        shutil.copyfile(source / src, dest(rel))
        out[_nfc(rel)] = outcome

    def save(im: Image.Image, rel: str, outcome: str, fmt: str, **kw: object) -> None:
        im.save(dest(rel), fmt, **kw)
        out[_nfc(rel)] = outcome

    # --- good files, names with spaces / non-ASCII / upper case --------------------
    copy("people/astronaut.jpg", "good/astronaut.jpg", OK)
    copy("animals/chelsea.png", "good/chelsea.png", OK)
    copy("people/grace_hopper_exif6.jpg", "good/grace_hopper_exif6.jpg", OK)
    copy("plants/green_meadow.jpg", "good/UPPER CASE.JPEG", OK)
    copy("objects/café.jpg", "café crème/tasse à café.jpg", OK)
    copy("objects/coffee_cup_portrait.jpg", "café crème/naïve_portrait.jpg", OK)

    # --- hidden and non-image files: ignored --------------------------------------
    ds = dest("good/.DS_Store")
    ds.write_bytes(b"\x00\x00\x00\x01Bud1" + b"\x00" * 2040)
    out["good/.DS_Store"] = IGNORE
    copy("animals/chelsea.jpg", "good/.hidden.jpg", IGNORE)
    dest("good/notes.txt").write_text("Notes about this class; not an image.\n")
    out["good/notes.txt"] = IGNORE

    # --- odd but valid formats ----------------------------------------------------
    copy("plants/fresh_flower_cmyk.jpg", "formats/cmyk.jpg", OK)
    copy("people/cameraman_portrait_gray.jpg", "formats/grayscale.jpg", OK)
    copy("outdoor scenes/dune_progressive.jpg", "formats/progressive.jpg", OK)
    copy("animals/chelsea.png", "formats/png_named.jpg", OK)
    copy("objects/coffee_cutout_rgba.png", "formats/rgba.png", OK)

    rocket = _rgb("objects/rocket.jpg", source)
    pal = rocket.crop((200, 0, 440, 427)).quantize(255, method=Image.Quantize.MEDIANCUT)
    mask = Image.new("L", pal.size, 0)
    ImageDraw.Draw(mask).ellipse((10, 10, pal.width - 10, pal.height - 10), fill=255)
    palette = pal.getpalette() or []
    pal.putpalette(palette[: 255 * 3] + [255, 255, 255])  # index 255: white, transparent
    pal.paste(255, mask=ImageOps.invert(mask))  # outside the ellipse: transparent index
    save(pal, "formats/palette_transparency.png", OK, "PNG", transparency=255)

    hubble = _rgb("outdoor scenes/hubble_crop.jpg", source)
    gray = _to_full_range_u16(_float_channel(hubble.convert("L"), (320, 240)))
    # A left-to-right ramp over the photo keeps a smooth gradient across the whole range.
    ramp = np.linspace(0.0, 1.0, gray.shape[1])[None, :]
    gray = _to_full_range_u16(gray.astype(np.float64) * 0.5 + ramp * 65535.0 * 0.5)
    save(Image.fromarray(gray), "formats/gray16.png", OK, "PNG")

    coffee = _rgb("objects/café.jpg", source)
    rgb16 = np.stack([_to_full_range_u16(_float_channel(b, (300, 200))) for b in coffee.split()], axis=-1)
    _write_png16_rgb(dest("formats/rgb16.png"), rgb16)
    out["formats/rgb16.png"] = OK

    chelsea = _rgb("animals/chelsea.jpg", source)
    frames = [chelsea.crop((x, 40, x + 200, 240)) for x in (40, 130, 220)]
    frames = [f.quantize(256, method=Image.Quantize.MEDIANCUT) for f in frames]
    save(
        frames[0],
        "formats/animated.gif",
        OK,
        "GIF",
        save_all=True,
        append_images=frames[1:],
        duration=200,
        loop=0,
    )

    page1 = rocket.resize((160, 107), Image.Resampling.LANCZOS)
    page2 = _rgb("plants/marigold.jpg", source).resize((120, 97), Image.Resampling.LANCZOS)
    save(page1, "formats/multipage.tif", OK, "TIFF", save_all=True, append_images=[page2])

    # --- broken: must be skipped --------------------------------------------------
    data = (source / "people/astronaut.jpg").read_bytes()
    dest("broken/truncated.jpg").write_bytes(data[: int(len(data) * 0.6)])
    out["broken/truncated.jpg"] = SKIP
    dest("broken/empty.jpg").write_bytes(b"")
    out["broken/empty.jpg"] = SKIP
    dest("broken/text.jpg").write_text("This is not a JPEG, only text with a .jpg name.\n")
    out["broken/text.jpg"] = SKIP
    _write_bomb_png(dest("broken/bomb.png"))
    out["broken/bomb.png"] = SKIP

    unreadable = dest(UNREADABLE)
    shutil.copyfile(source / "animals/chelsea_face.jpg", unreadable)
    unreadable.chmod(0)
    try:
        with unreadable.open("rb"):
            pass
        out[UNREADABLE] = OK  # root (or CAP_DAC_OVERRIDE): mode bits are not enforced
    except PermissionError:
        out[UNREADABLE] = SKIP

    # --- empty class folder -------------------------------------------------------
    (root / EMPTY_CLASS).mkdir(exist_ok=True)
    return out


def by_outcome(corpus: dict[str, str]) -> dict[str, list[str]]:
    """Group a corpus dict by outcome: ``{"ok": [...], "skip": [...], "ignore": [...]}``."""
    groups: dict[str, list[str]] = {OK: [], SKIP: [], IGNORE: []}
    for rel, outcome in sorted(corpus.items()):
        groups[outcome].append(rel)
    return groups


def expected_image(path: Path | str, mode: str = "RGB") -> Image.Image:
    """Reference decode of an "ok" corpus file, for comparing with what a reader returns.

    Pillow opens the file (content sniffed, not by extension), takes the first
    frame/page, applies the EXIF orientation, and converts to ``mode``. 16-bit
    grayscale is scaled to 8 bits (value >> 8) rather than clipped. Transparency is
    dropped by Pillow's plain ``convert`` (RGBA -> RGB keeps the colour channels; a
    palette image keeps its palette colours), so compare transparent files loosely or
    not at all if the packer composites onto a background.
    """
    with Image.open(path) as im:
        im.seek(0)
        im.load()
        im = ImageOps.exif_transpose(im)
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            arr = np.asarray(im).astype(np.uint32) >> 8
            im = Image.fromarray(arr.astype(np.uint8), "L")
        return im.convert(mode)
