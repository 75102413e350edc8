"""`pack doctor` and the window decoder's loading rule (readers/image/jpegwindow.py): which libjpeg-turbo
is loaded, in what order the candidates are tried, and that every refusal is named."""

from __future__ import annotations

import ast
import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from readers.formats import format_names
from readers.image import jpegwindow

ROOT = Path(__file__).resolve().parents[3]


def doctor(env: dict[str, str] | None = None) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "packer.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_doctor_names_the_loaded_library_and_the_formats():
    data = doctor()
    assert data["window_decoder"]["on"] is True
    path = data["window_decoder"]["status"].removeprefix("on: ")
    assert Path(path).is_file() and "jpeg" in Path(path).name
    assert path == jpegwindow.LIBRARY
    assert set(data["formats"]) >= set(format_names())  # every registered format, named
    assert all(item["ok"] for item in data["optional"].values()), data["optional"]


def test_switched_off_and_missing_libraries_are_named():
    assert doctor({"IMGPACK_JPEG_WINDOW": "0"})["window_decoder"] == {
        "on": False,
        "status": "off: IMGPACK_JPEG_WINDOW=0",
    }
    missing = doctor({"IMGPACK_LIBJPEG": "/nonexistent/libjpeg.so.62"})["window_decoder"]
    assert missing["on"] is False and "/nonexistent/libjpeg.so.62" in missing["status"]


def test_a_library_that_is_not_libjpeg_turbo_is_refused_by_name():
    other = ctypes.util.find_library("z") or ctypes.util.find_library("c")
    assert other is not None
    status = doctor({"IMGPACK_LIBJPEG": other})["window_decoder"]
    assert status["on"] is False
    assert "has no jpeg_std_error" in status["status"] and other in status["status"]


def test_the_explicit_library_is_the_only_candidate_and_loads(monkeypatch):
    bundled = jpegwindow.library_candidates()
    assert bundled and jpegwindow.LIBRARY in bundled
    monkeypatch.setenv("IMGPACK_LIBJPEG", jpegwindow.LIBRARY)
    assert jpegwindow.library_candidates() == [jpegwindow.LIBRARY]
    status = doctor({"IMGPACK_LIBJPEG": jpegwindow.LIBRARY})["window_decoder"]["status"]
    assert status == f"on: {jpegwindow.LIBRARY}"


def test_readers_fall_back_to_whole_decodes_without_the_decoder(packed, tmp_path):
    """A crop read with the decoder off gives the same pixels as with it on."""
    code = (
        "import sys, numpy as np\n"
        "from readers import open_iterable, RandomResizedCrop\n"
        "from readers.image import jpegwindow\n"
        "it = open_iterable(sys.argv[1], batch_size=8, crop=RandomResizedCrop(32), seed=3)\n"
        "images, _ = next(iter(it))\n"
        "np.save(sys.argv[2], images.numpy()); print(jpegwindow.DECODER is not None)\n"
    )
    dataset = packed("lmdb")
    outs = []
    for switch in ("1", "0"):
        out = tmp_path / f"{switch}.npy"
        run = subprocess.run(
            [sys.executable, "-c", code, str(dataset), str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT), "IMGPACK_JPEG_WINDOW": switch},
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == str(switch == "1")
        outs.append(out)
    np.testing.assert_array_equal(np.load(outs[0]), np.load(outs[1]))


def test_the_typed_stub_matches_the_extension():
    if jpegwindow._jpegwindow is None:
        pytest.fail("the C extension is not built: CI builds it (pip install -e .)")
    stub = ast.parse((ROOT / "readers" / "_jpegwindow.pyi").read_text())
    functions = {f.name: f for f in stub.body if isinstance(f, ast.FunctionDef)}
    public = {name for name in dir(jpegwindow._jpegwindow) if not name.startswith("_")}
    assert set(functions) == public
    decode_args = functions["decode"].args.posonlyargs
    with pytest.raises(TypeError):  # one argument more than the stub declares is refused
        jpegwindow._jpegwindow.decode(*([0] * (len(decode_args) + 1)))


def decoder_is_off() -> bool:
    from readers.image import jpegwindow as loaded  # noqa: PLC0415 - imported in the spawned child

    return loaded.DECODER is None


def test_benchmarks_switch_the_decoder_by_environment_not_by_a_module_global():
    from packer.bench.harness import run_isolated  # noqa: PLC0415

    before = os.environ.get("IMGPACK_JPEG_WINDOW")
    assert run_isolated(decoder_is_off, env={"IMGPACK_JPEG_WINDOW": "0"}) is True
    assert run_isolated(decoder_is_off) is False
    assert os.environ.get("IMGPACK_JPEG_WINDOW") == before
    assert jpegwindow.DECODER is not None
