"""Shared fixtures: the sample folder, packed copies of it per format, the CLI as a subprocess."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.s3server import s3  # noqa: F401 - the moto S3 server fixture, for every test file

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO / "sample_data"

_RAY_WORD = re.compile(r"(^|[_/\[-])ray([_.\]-]|$)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads xdist_group to name the group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the moto S3 server is a ``remote`` test (``pytest -m "not remote"``).
    Tests that start Ray share one xdist worker (``make test`` runs two): ``ray stop --force``
    and the fault tests' process scans act on every Ray process of the machine."""
    for item in items:
        if "s3" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.remote)
        if item.get_closest_marker("ray") or _RAY_WORD.search(item.nodeid.lower()):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.xdist_group("ray"))


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_cli(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``pack ARGS`` as a real subprocess (``python -m packer.cli``, this checkout's code)."""
    proc = subprocess.run(
        [sys.executable, "-m", "packer.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pack {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE_DATA


_PACKED: dict[tuple, Path] = {}


@pytest.fixture(scope="session")
def packed(tmp_path_factory):
    """packed(fmt, **spec) -> path of sample_data packed that way (cached for the session)."""
    from packer.engine.pack_run import pack_folder
    from readers.formats.packed_sample import PreprocessSpec

    def make(fmt: str = "lmdb", src: Path = SAMPLE_DATA, options: dict | None = None, **spec) -> Path:
        key = (fmt, str(src), tuple(sorted((options or {}).items())), tuple(sorted(spec.items())))
        if key not in _PACKED:
            out = tmp_path_factory.mktemp(f"packed-{fmt}") / "ds"
            pack_folder(src, out, fmt, PreprocessSpec(**spec), workers=2, options=options or {})
            _PACKED[key] = out
        return _PACKED[key]

    return make


def packed_items(root: Path, src: Path = SAMPLE_DATA) -> list:
    """The source's items in the order the dataset at ``root`` stores them (packs shuffle the
    source), each ``index`` being its dataset index."""
    from packer.sources.source import SourceItem, scan_folder
    from readers import source_paths

    by_rel = {item.rel: item for item in scan_folder(src).items}
    return [SourceItem(k, by_rel[r].path, r, by_rel[r].label) for k, r in enumerate(source_paths(root))]


def reference_pixels(path: str, spec) -> np.ndarray:
    """The preprocessed image before encoding, straight from Pillow (what lossless formats store)."""
    from packer.transform.preprocess import preprocess_image

    raw = open(path, "rb").read()
    with Image.open(io.BytesIO(raw)) as img:
        out, _ = preprocess_image(img, raw, spec)
        array = np.asarray(out)
    return array[:, :, None] if array.ndim == 2 else array
