"""The window decoder checked against a whole decode + crop, and built with other compiler flags.

``check_window`` decodes one window of one (possibly damaged) JPEG with the extension and says
what is wrong, if anything: an exception, a write past the output buffer, a result that does not
fit the buffer or the header, or pixels that differ from the reference. References:
- the same extension decoding whole rows from the first one (no crop, no skipped rows),
  cropped: exact, at every DCT scale and with either IDCT;
- Pillow's whole decode, cropped, where Pillow decodes the file without an error in the same
  colour space at full size with the accurate IDCT: exact (Pillow's libjpeg-turbo is the library
  the extension dlopens, readers/image/jpegwindow.py).
A refusal (None) is always allowed: the readers then decode the image whole with their general
decoders, which report damage.

``build_extension`` compiles csrc/ into a directory with extra flags (AddressSanitizer + UBSan
for tests/readers/image/test_decoder_sanitized.py, coverage for tests/support/fuzz_jpegwindow.py), and
``install_extension`` makes ``readers.image.jpegwindow`` load that build (with the same library search
as always). Run as ``python -m tests.support.jpeg_differential SO CORPUS FINDINGS`` it replays every file
of CORPUS through that build (the sanitizer test's child process).
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import subprocess
import sys
import sysconfig
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.support.jpeg_corpus import WindowParams, jpeg_size, window_params

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "csrc" / "jpegwindow.c"]
CANARY = 0xA5
SANITIZER_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
SANITIZER_FLAGS += ["-fno-sanitize-recover=all"]  # UBSan stops at its first report


def gcc_runtime(name: str) -> str:
    """The path of one of gcc's runtime libraries (libasan.so, libstdc++.so.6)."""
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True)
    return found.stdout.strip()


def build_extension(dest: Path, cflags: list[str], objects: Sequence[Path] = ()) -> Path:
    """csrc/ compiled with ``cflags`` (and linked with ``objects``) into dest/_jpegwindow*.so."""
    dest.mkdir(parents=True, exist_ok=True)
    so = dest / ("_jpegwindow" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = ["-I", str(ROOT / "csrc" / "libjpeg-turbo"), "-I", sysconfig.get_paths()["include"]]
    command = ["gcc", "-shared", "-fPIC", *cflags, *include, *map(str, SOURCES), *map(str, objects), "-ldl"]
    subprocess.run([*command, "-o", str(so)], check=True, capture_output=True, text=True)
    return so


def install_extension(so: Path) -> Any:
    """Import ``so`` as readers._jpegwindow (before readers.image.jpegwindow is imported) and return
    readers.image.jpegwindow, whose DECODER is then that build with the library it always loads."""
    assert "readers.image.jpegwindow" not in sys.modules, (
        "install the build before importing readers.image.jpegwindow"
    )
    spec = importlib.util.spec_from_file_location("readers._jpegwindow", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["readers._jpegwindow"] = module
    from readers.image import jpegwindow

    assert jpegwindow._jpegwindow is module
    return jpegwindow


def _guarded(size: int) -> tuple[np.ndarray, np.ndarray]:
    """A buffer of ``size`` bytes followed by 64 canary bytes: (whole, the part handed out)."""
    whole = np.full(size + 64, CANARY, np.uint8)
    return whole, whole[:size]


def _pillow_whole(data: bytes, gray: bool) -> np.ndarray | None:
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode != ("L" if gray else "RGB") or image.format != "JPEG":
                return None
            array = np.asarray(image)
    except Exception:  # Pillow's own refusal: nothing to compare with
        return None
    return array.reshape(*array.shape[:2], 1 if gray else 3)


def check_window(decoder: Any, data: bytes, params: WindowParams) -> tuple[str, list[str]]:
    """Decode one window; (what happened: refused / decoded / checked-pillow, the problems)."""
    top, left, h, w, eighths, gray, fast_dct = params
    size = jpeg_size(data)
    channels = 1 if gray else 3
    height, width = (min(v, 65500) for v in size or (64, 64))  # as window_params
    sw = -(-width * eighths // 8)
    buffer_size = max(1, h * sw * channels)
    whole, out = _guarded(buffer_size)
    try:
        result = decoder.decode(data, out, top, left, h, w, eighths, gray, fast_dct)
    except Exception as exc:
        return "raised", [f"decode raised {type(exc).__name__}: {exc}"]
    if not (whole[buffer_size:] == CANARY).all():
        return "overflow", [f"wrote past the {buffer_size}-byte output buffer"]
    if result is None:
        return "refused", []
    row_width, skip, image_height, image_width = result
    problems = []
    if (image_height, image_width) != size:
        problems.append(f"image size {image_height}x{image_width}, the header says {size}")
    if skip > left or skip + w > row_width or h * row_width * channels > buffer_size:
        problems.append(f"row_width {row_width} skip {skip} do not fit the window or the buffer")
    if problems:
        return "decoded", problems
    got = out[: h * row_width * channels].reshape(h, row_width, channels)[:, skip : skip + w]
    rows_whole, rows = _guarded((top + h) * sw * channels)
    reference = decoder.decode(data, rows, 0, 0, top + h, sw, eighths, gray, fast_dct)
    if reference is None:
        # the same rows were read, only cropped or skipped: they must decode too
        problems.append("the window decoded but whole rows from the first are refused")
    else:
        want = rows[: (top + h) * sw * channels].reshape(top + h, sw, channels)[top:, left : left + w]
        if not np.array_equal(got, want):
            diff = int(np.abs(got.astype(int) - want.astype(int)).max())
            problems.append(f"pixels differ from whole rows + crop by up to {diff}")
    if not (rows_whole[(top + h) * sw * channels :] == CANARY).all():
        problems.append("the whole-rows decode wrote past its buffer")
    if eighths != 8 or fast_dct:
        return "decoded", problems
    full = _pillow_whole(data, gray)
    if full is None or full.shape[:2] != (height, width):
        return "decoded", problems
    if not np.array_equal(got, full[top : top + h, left : left + w]):
        diff = int(np.abs(got.astype(int) - full[top : top + h, left : left + w].astype(int)).max())
        problems.append(f"pixels differ from Pillow's whole decode + crop by up to {diff}")
    return "checked-pillow", problems


def windows_for(name: str, data: bytes, count: int) -> list[WindowParams]:
    """``count`` windows for a file, a function of its name (a failure reproduces from it): the
    whole image first, then random ones at random scales, flags and IDCTs."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    size = jpeg_size(data)
    first = window_params(bytes([0, 0, 255, 255, 4, 0]), size)
    return [first] + [window_params(rng.bytes(6), size) for _ in range(count - 1)]


def replay(decoder: Any, corpus: Path, findings: Path, windows: int = 3) -> dict:
    """Every file of ``corpus`` through ``check_window``; a file with a problem is copied into
    ``findings``. ``findings/current`` names the file being decoded (a crash leaves it there)."""
    findings.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    problems: list[str] = []
    for path in sorted(corpus.iterdir()):
        (findings / "current").write_text(path.name)
        data = path.read_bytes()
        for params in windows_for(path.name, data, windows):
            outcome, found = check_window(decoder, data, params)
            counts[outcome] = counts.get(outcome, 0) + 1
            if found:
                shutil.copy(path, findings / path.name)
                problems += [f"{path.name} {params}: {p}" for p in found]
    (findings / "current").unlink()
    return {"files": len(list(corpus.iterdir())), "outcomes": counts, "problems": problems}


def main() -> None:
    so, corpus, findings = map(Path, sys.argv[1:4])
    jpegwindow = install_extension(so)
    assert jpegwindow.DECODER is not None, "the sanitized build found no libjpeg-turbo"
    summary = replay(jpegwindow.DECODER, corpus, findings)
    summary["library"] = jpegwindow.LIBRARY
    maps = Path("/proc/self/maps").read_text()
    summary["sanitizers"] = [name for name in ("libasan", "libubsan") if name in maps]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
