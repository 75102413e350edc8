"""FFCV as a peer of ``pack bench --cold`` / ``--memory-cap`` (``--peer ffcv``): the ``.beton``
of a dataset's images, made once, and the command that reads one epoch of it.

FFCV 1.0.2 lives in its own virtualenv (a benchmark peer only, never a dependency of imgpack),
``--ffcv-python`` (default ``/work/ffcv-venv/bin/python``); ``BUILD`` says how to make it. Its
side runs in ``packer.bench.ffcv_epoch`` (import-light, so that interpreter runs it).

The ``.beton`` holds the dataset's stored bytes as they are (JPEG, or raw pixels), in sample order,
not images FFCV re-encoded: both readers then decode the same JPEGs. It is written beside the
datasets (``imgpack-peers/`` in the dataset's folder, or ``--peer-dir``) under the dataset's name
and the sha256 of its manifest, with a sidecar ``.json`` written last that marks it complete; a
later run of the same dataset reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.bench.ffcv_epoch import COLUMNS, DATA, INDEX, MODES
from packer.bench.harness import BenchError, code_env

CHILD = "packer.bench.ffcv_epoch"  # run by FFCV's interpreter
DEFAULT_PYTHON = "/work/ffcv-venv/bin/python"
PEER_DIR = "imgpack-peers"  # beside a dataset, unless --peer-dir names another folder
DEFAULT_PAGE_SIZE = 8 << 20  # FFCV 1.0.2's DatasetWriter default (4 x its 2 MiB minimum)
MIN_PAGE_SIZE, MAX_PAGE_SIZE = 2 << 20, 1 << 32  # FFCV's bounds: a power of 2 in [2 MiB, 4 GiB)
BUILD = (
    "build it with: apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config && "
    "python3 -m venv /work/ffcv-venv && /work/ffcv-venv/bin/pip install -c constraints.txt torch==2.13.0 && "
    "/work/ffcv-venv/bin/pip install -c constraints.txt numba pillow ffcv==1.0.2"
)


@dataclass(frozen=True)
class Beton:
    """A dataset's ``.beton``: its file and size, images, and the range of the stored shorter sides."""

    path: Path
    bytes: int
    images: int
    short_side: tuple[int, int]

    def ratio(self, crop: int) -> float:
        """``CenterCropRGBImageDecoder``'s ratio for a window of ``crop`` pixels of the shortest
        stored side (FFCV takes ``int(ratio * side)``: the half pixel keeps the rounding off it)."""
        return (crop + 0.5) / self.short_side[0]


def python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the FFCV peer (one line, with how to build it), or None."""
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        return f"{python}: no such Python; {BUILD}, or name one that has FFCV 1.0.2"
    try:
        check = [python, "-c", "import ffcv.loader"]
        done = subprocess.run(check, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: cannot run it ({exc}); {BUILD}"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"{python} cannot import ffcv ({last}); {BUILD}"
    return None


def peer_folder(dataset: str, peer_dir: str | None) -> Path:
    return Path(peer_dir) if peer_dir else Path(dataset).resolve().parent / PEER_DIR


def page_size_problem(page_size: int) -> str | None:
    """Why FFCV's writer would refuse ``page_size`` (one line), or None."""
    if page_size < MIN_PAGE_SIZE or page_size >= MAX_PAGE_SIZE or page_size & (page_size - 1):
        return f"{page_size} bytes: FFCV's pages are a power of 2 from 2 MiB up to (not including) 4 GiB"
    return None


def beton_path(dataset: str, peer_dir: str | None, page_size: int = DEFAULT_PAGE_SIZE) -> Path:
    """Where the ``.beton`` of ``dataset`` lives: its name and its manifest's sha256 (a re-packed
    dataset gets a new one), and its page size where it is not FFCV's default."""
    sha = hashlib.sha256((Path(dataset) / "manifest.json").read_bytes()).hexdigest()[:16]
    pages = "" if page_size == DEFAULT_PAGE_SIZE else f"-pages{page_size >> 20}M"
    return peer_folder(dataset, peer_dir) / f"{Path(dataset).resolve().name}-{sha}{pages}.beton"


def export_records(dataset: str, out: Path, block: int = 512) -> dict:
    """The stored bytes of every sample of ``dataset``, in order, for FFCV's writer: ``records.bin``
    and ``records.npy`` (``ffcv_epoch.COLUMNS`` per record). Returns the count and shorter sides."""
    from readers.formats import open_reader

    reader = open_reader(dataset)
    out.mkdir(parents=True, exist_ok=True)
    index = np.zeros((len(reader), len(COLUMNS)), dtype=np.int64)
    offset = 0
    with open(out / DATA, "wb") as sink:
        for start in range(0, len(reader), block):
            records = reader.read_many(np.arange(start, min(start + block, len(reader))))
            for i, rec in enumerate(records, start):
                if rec.encoding == "jpeg" or bytes(rec.data[:3]) == b"\xff\xd8\xff":  # "original" JPEGs too
                    mode = MODES.index("jpg")
                elif rec.encoding == "raw" and rec.channels == 3:
                    mode = MODES.index("raw")
                else:
                    raise BenchError(
                        f"{dataset}: sample {i} is stored as {rec.encoding} ({rec.channels} channels); "
                        "--peer ffcv reads the stored bytes as they are, which FFCV takes as JPEG or RGB "
                        "pixels: pack the dataset with --encode jpeg, or leave out --peer ffcv"
                    )
                size = sink.write(rec.data)
                index[i] = (offset, size, rec.height, rec.width, rec.label, mode)
                offset += size
    np.save(out / INDEX, index)
    shorter = np.minimum(index[:, 2], index[:, 3]) if len(index) else np.zeros(1, np.int64)
    return {"images": len(index), "short_side": [int(shorter.min()), int(shorter.max())]}


def ensure_beton(
    dataset: str,
    peer_dir: str | None,
    python: str,
    workers: int,
    say: Callable[[str], None],
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Beton:
    """The ``.beton`` of ``dataset`` in pages of ``page_size`` bytes: the one a previous run wrote,
    else written now. FFCV's reader with ``os_cache=False`` holds whole pages in memory (a few per
    batch in flight), so the page size sets its memory."""
    path = beton_path(dataset, peer_dir, page_size)
    done = path.with_suffix(".json")  # written last: the .beton beside it is complete
    if not done.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        export = path.with_suffix(".export")
        part = path.parent / f"{path.name}.part"
        say(f"{dataset}: writing its stored bytes as FFCV's {path} (once)")
        try:
            facts = export_records(dataset, export)
            settings = {"export": str(export), "beton": str(part), "workers": workers, "page_size": page_size}
            cmd = [python, "-m", CHILD, "write", json.dumps(settings)]
            run = subprocess.run(cmd, capture_output=True, text=True, env=code_env())
            if run.returncode:
                tail = " / ".join(run.stderr.strip().splitlines()[-3:])
                raise BenchError(f"{path}: FFCV's writer ({python}) exited {run.returncode}: {tail}")
            os.replace(part, path)
        finally:
            shutil.rmtree(export, ignore_errors=True)
            part.unlink(missing_ok=True)
        facts |= {"dataset": str(Path(dataset).resolve()), "bytes": path.stat().st_size}
        done.write_text(json.dumps(facts, indent=1) + "\n")
    facts = json.loads(done.read_text())
    if not path.is_file() or path.stat().st_size != facts["bytes"]:
        raise BenchError(f"{path}: missing or not the size {done} records; delete {done} to write it again")
    return Beton(path, facts["bytes"], facts["images"], tuple(facts["short_side"]))  # type: ignore[arg-type]


def read_command(
    python: str, beton: Beton, workers: int, batch_size: int, crop: int, seed: int, epoch: int
) -> list[str]:
    """The command that reads one epoch of ``beton`` with FFCV, in its setting for data larger than
    memory (``os_cache=False``, ``QUASI_RANDOM``), centre-cropped to ``crop``."""
    settings = {
        "beton": str(beton.path),
        "workers": max(1, workers),  # --workers 0 reads in one process; FFCV's 0 would be every core
        "batch_size": batch_size,
        "crop": crop,
        "ratio": beton.ratio(crop),
        "seed": seed,
        "epoch": epoch,
        "os_cache": False,
        "order": "QUASI_RANDOM",
    }
    return [python, "-m", CHILD, "read", json.dumps(settings)]
