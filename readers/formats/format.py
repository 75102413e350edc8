"""What a format is, as data: the one object the packer, the outputs, the CLI and the tests ask.

A format is one package (``readers/formats/<name>/``) whose ``__init__`` exposes a ``Format``:
its reader and writer (named "module:Class" and imported on first use, so a training job never
imports a writer), the files it owns in an output (what ``--force`` may delete, locally and in a
bucket), how a part is finished on object storage, the encodings it stores and the pack and
reader options it takes. This module is a leaf: it imports nothing of imgpack above the manifest.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from readers.formats.pack_option import SAMPLES_PER_SHARD, SHARDS, PackOption
from readers.store.manifest import ENCODINGS

# Pack options every format takes: how the dataset is cut into shards.
SHARDING_OPTIONS = (SHARDS, SAMPLES_PER_SHARD)
# Reader options every reader takes (remote datasets; see readers.remote.remote_parts).
COMMON_READER_OPTIONS = ("cache_dir", "cache_size", "storage_options")

# How a finished part reaches its place in a URL output (packer/output/remote_output.py):
# "rename": server-side copy + delete of the part files to the shard names (no download);
# "as-is": the uploaded part files are the shards; "local": the parts are downloaded, finished
# locally by the writer and uploaded again (formats whose finish rewrites files).
RemoteFinish = Literal["rename", "as-is", "local"]
Loadable = str | type  # "module:Class", or the class itself (formats defined in a test)


def load(target: Loadable | str) -> Any:
    """The object ``target`` names ("module:attr"), imported now; a class is returned as it is."""
    if not isinstance(target, str):
        return target
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@dataclass(frozen=True)
class Format:
    name: str
    reader: Loadable
    writer: Loadable
    # Top-level file names in an output that belong to this format (data files, indexes).
    files: re.Pattern[str]
    # Top-level folders it owns: (folder name, the paths of the files below it) -> ours?
    folder: Callable[[str, Sequence[str]], bool] | None = None
    # Top-level file names that are its only in an output whose manifest names this format (the
    # BMP cache's images of a source without class folders: imagelist, COCO, Parquet).
    dataset_files: re.Pattern[str] | None = None
    remote_finish: RemoteFinish | None = "local"  # None: cannot be written to a URL
    encodings: tuple[str, ...] = ENCODINGS  # one only: the pack pins it (--to bmp is --encode bmp)
    pack_options: tuple[PackOption, ...] = SHARDING_OPTIONS  # typed; keyed by name in PackSpec.options
    reader_options: tuple[str, ...] = ()  # the reader's own, besides COMMON_READER_OPTIONS
    # "module:function(fileobj, where) -> (count, index text)" rebuilding a shard's index (reindex).
    indexer: str | None = None
    # Whether it stores per-sample fields (readers/fields/field_schema.py) in its own idiom; a pack with
    # fields to a format that does not is refused (FormatWriter.with_fields).
    stores_fields: bool = False

    def reader_class(self) -> type:
        return load(self.reader)

    def writer_class(self) -> type:
        return load(self.writer)

    def owns(self, name: str, below: Sequence[str] | None = None, in_dataset: bool = False) -> bool:
        """Whether the output entry ``name`` is this format's: a file (``below`` None) or a folder
        holding the files ``below`` (paths relative to it); ``in_dataset``: the output's manifest
        names this format."""
        if below is None:
            listed = in_dataset and self.dataset_files is not None and self.dataset_files.fullmatch(name)
            return bool(self.files.fullmatch(name) or listed)
        return self.folder is not None and self.folder(name, below)

    def pack_option(self, name: str) -> PackOption | None:
        """The pack option called ``name`` this format declares, or None."""
        return next((option for option in self.pack_options if option.name == name), None)

    def accepts_reader_option(self, option: str) -> bool:
        return option in self.reader_options or option in COMMON_READER_OPTIONS
