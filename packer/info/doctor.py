"""``pack doctor``: what this installation can do, and why not where it cannot.

The window decoder (readers/image/jpegwindow.py) is optional and silent by design: without it crops
decode the whole JPEG. This command says whether it is on, which libjpeg-turbo it loaded, or why
it is off; and which optional components (remote storage, Ray, DALI, Parquet, plots) import.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import click

# (what it enables, the module to import, the distribution whose version is shown, the pip extra)
OPTIONAL = (
    ("datasets behind s3:// and other URLs", "s3fs", "s3fs", "remote"),
    ("pack --engine ray", "ray", "ray", "ray"),
    ("DALI loaders (readers.dali)", "nvidia.dali", "nvidia-dali-cuda120", "dali"),
    ("pack parquet", "pyarrow", "pyarrow", "parquet"),
    ("pack bench --plot, pack show", "matplotlib", "matplotlib", "plot"),
)


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _component(module: str, distribution: str) -> tuple[bool, str]:
    try:
        importlib.import_module(module)
    except Exception as exc:  # an optional import may fail in any way (a missing CUDA runtime...)
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, _version(distribution) or "installed"


def report() -> dict[str, Any]:
    """What ``pack doctor`` prints, as data."""
    from readers.formats.registry import format_names
    from readers.image import jpegwindow

    components = {}
    for purpose, module, distribution, extra in OPTIONAL:
        ok, detail = _component(module, distribution)
        components[module] = {"for": purpose, "ok": ok, "detail": detail, "extra": extra}
    return {
        "imgpack": _version("imgpack") or "not installed (run from a checkout)",
        "python": platform.python_version(),
        "torch": _version("torch"),
        "formats": format_names(),
        "window_decoder": {"on": jpegwindow.DECODER is not None, "status": jpegwindow.STATUS},
        "optional": components,
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(as_json: bool) -> None:
    """Say what this installation can do: the JPEG window decoder (on, with which libjpeg-turbo,
    or why it is off) and the optional components that import, with the pip extra for those that
    do not. Exit 0 either way: everything missing here has a slower or a narrower fallback."""
    data = report()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"imgpack {data['imgpack']}, Python {data['python']}, torch {data['torch']} ({sys.platform})")
    click.echo(f"formats: {', '.join(data['formats'])}")
    click.echo(f"window decoder: {data['window_decoder']['status']}")
    if data["window_decoder"]["on"] is False:
        click.echo("  crops decode the whole JPEG instead (same pixels, slower)")
    for module, item in data["optional"].items():
        if item["ok"]:
            click.echo(f"{module}: {item['detail']} ({item['for']})")
        else:
            click.echo(f"{module}: missing, {item['for']} unavailable ({item['detail']}; "
                       f"pip install \"imgpack[{item['extra']}]\")")
