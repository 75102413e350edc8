"""Arithmetic-coded and 12-bit JPEGs, made by csrc/fuzz/variants.c with the libjpeg-turbo the window
decoder loads (Pillow and OpenCV write neither). Seeds of the sanitizer replay and the fuzzer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from tests.support.jpeg import textured_pixels
from tests.support.jpeg_corpus import PILLOW_KINDS, pillow_jpeg

ROOT = Path(__file__).resolve().parents[2]


def build_tool(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    tool = dest / "jpeg-variants"
    source = ROOT / "csrc" / "fuzz" / "variants.c"
    subprocess.run(["gcc", "-O1", str(source), "-ldl", "-o", str(tool)], check=True, capture_output=True)
    return tool


def _run(tool: Path, library: str, args: list[str], stdin: bytes) -> bytes:
    done = subprocess.run([str(tool), library, *args], input=stdin, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def arithmetic(tool: Path, library: str, data: bytes, progressive: bool = False) -> bytes:
    """``data`` (a JPEG) with the same coefficients, arithmetic-coded."""
    return _run(tool, library, ["arithmetic"] + (["progressive"] if progressive else []), data)


def twelve_bit(tool: Path, library: str, pixels: np.ndarray, arithmetic_coded: bool = False) -> bytes:
    """A 12-bit JPEG of the 8-bit ``pixels`` (H x W x 1 or 3) scaled by 16."""
    height, width = pixels.shape[:2]
    components = 1 if pixels.ndim == 2 else pixels.shape[2]
    args = ["12bit", str(height), str(width), str(components)] + (["arithmetic"] if arithmetic_coded else [])
    return _run(tool, library, args, np.ascontiguousarray(pixels, np.uint8).tobytes())


def variants(tool: Path, library: str) -> dict[str, bytes]:
    """About 30 files: arithmetic-coded (sequential and progressive, colour and grey, restart
    markers kept) and 12-bit (Huffman and arithmetic) at a spread of sizes."""
    out: dict[str, bytes] = {}
    for height, width in [(1, 1), (17, 33), (64, 48), (100, 131)]:
        pixels = textured_pixels(height, width, seed=width)
        for kind in ("420", "444", "restart-rows"):
            baseline = pillow_jpeg(pixels, **PILLOW_KINDS[kind])
            out[f"arithmetic-{kind}-{height}x{width}"] = arithmetic(tool, library, baseline)
            out[f"arithmetic-progressive-{kind}-{height}x{width}"] = arithmetic(tool, library, baseline, True)
        out[f"arithmetic-grey-{height}x{width}"] = arithmetic(tool, library, pillow_jpeg(pixels, "L"))
        out[f"12bit-{height}x{width}"] = twelve_bit(tool, library, pixels)
        out[f"12bit-grey-{height}x{width}"] = twelve_bit(tool, library, pixels[..., 0])
        out[f"12bit-arithmetic-{height}x{width}"] = twelve_bit(tool, library, pixels, True)
    return out
