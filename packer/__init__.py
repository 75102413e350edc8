"""imgpack packer: the public API for packing from Python.

    from packer import PackSpec, PreprocessSpec, pack, pack_folder, append_to

Attributes are imported on first use, so ``import packer`` (the CLI's first step) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "pack_folder": "packer.engine.pack_run",
    "pack": "packer.engine.pack_run",
    "PackReport": "packer.engine.pack_run",
    "PackSpec": "packer.spec",
    "PreprocessSpec": "readers.formats.packed_sample",
    "append_to": "packer.edit.append",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
