"""Which source file each sample came from: ``source-paths.nul`` beside the manifest.

A pack writes its samples in a shuffled order, so a sample's dataset index says nothing about
its source file; this file says it. It holds the relative source path of every sample in dataset
order, UTF-8 (``surrogateescape`` for names that are not) and NUL-terminated (a path may hold
any other character), so ``tr '\\0' '\\n' < source-paths.nul | sed -n 43p`` is sample 42's path.
"""

from __future__ import annotations

import os
from typing import Any

from readers.errors import ManifestError
from readers.remote.urls import is_url, join_url, read_url

SOURCE_PATHS_NAME = "source-paths.nul"


def source_paths(dataset: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The relative source path of each sample of ``dataset`` (a folder or a URL), by index."""
    url = is_url(dataset)
    path = join_url(str(dataset), SOURCE_PATHS_NAME) if url else os.path.join(dataset, SOURCE_PATHS_NAME)
    try:
        if url:
            data = read_url(path, storage_options)
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except FileNotFoundError:
        from readers.datasets.views import view_source_paths

        in_view = view_source_paths(dataset, storage_options, source_paths)
        if in_view is not None:  # a view (readers/datasets/views.py): its parent's paths at its indices
            return in_view
        raise ManifestError(
            f"{path}: missing (packs made before imgpack recorded sample order have none); "
            "re-pack the dataset to get it"
        ) from None
    return [p.decode("utf-8", "surrogateescape") for p in data.split(b"\0")[:-1]]


def source_index(dataset: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """Source path (relative, as in the manifest) -> dataset index."""
    return {path: i for i, path in enumerate(source_paths(dataset, storage_options))}
