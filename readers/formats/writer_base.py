"""The writer interface every format implements (beside the reader's, readers/formats/base.py).

The engine cuts the source into contiguous *parts* and, for each part, opens a ``PartWriter``
and adds that part's samples in source order. A part is self-contained (its own files, local
record positions), so parts can be written by different processes or Ray tasks without knowing
how many samples earlier parts skipped; ``FormatWriter.finish`` then names the files and gives
each its place (``Shard.first``) in the dataset. A writer is handed its ``Format`` (what it
declares: options, encodings, fields); what needs every format (which formats take an option)
is the registry's (``registry.open_writer``), so this module never imports the registry.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from readers.errors import ImgpackError
from readers.formats.format import Format
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.store.manifest import Shard


@dataclass
class PartResult:
    """What one part produced: its shard files (``first`` relative to the part) and its skips."""

    part: int
    shards: list[Shard]
    skipped: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(s.count for s in self.shards)


def disk_hint(path: Path) -> str:
    """A short diagnosis of why writing below ``path`` may have failed (full or read-only disk)."""
    import shutil

    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "check free space and permissions"
    if free < (64 << 20):
        return f"no space left on device ({free // 1024} KiB free); free some space or choose another -o"
    if not os.access(probe, os.W_OK):
        return "the location is not writable; choose another -o"
    return "check free space and permissions"


def add_label_runs(runs: list[list[int]], labels: list[int] | list[list[int]], counted: bool = False) -> None:
    """Extend ``runs`` ([[label, count], ...]) with ``labels`` (or with runs when ``counted``)."""
    for item in labels:
        # ``counted`` says which of the two kinds ``labels`` holds
        label, count = cast("list[int]", item) if counted else (cast(int, item), 1)
        if runs and runs[-1][0] == label:
            runs[-1][1] += count
        else:
            runs.append([label, count])


class PartWriter:
    fields: dict[str, str] = {}  # noqa: RUF012  # set by write_part: the schema of the fields stored
    classes: list[str] = []  # noqa: RUF012  # set by write_part: the dataset's class names

    def add(self, sample: PackedSample) -> None:
        raise NotImplementedError

    def close(self) -> list[Shard]:
        """Finish the part's files; shards with ``first`` counted from the part's start."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drop what was written (the part will be redone)."""

    def summary(self) -> dict[str, Any]:
        """Format-specific facts about the closed part, kept with it and handed to ``finish``."""
        return {}


class FormatWriter:
    # How many parts to cut the source into when the user does not say (None: one part).
    default_samples_per_part: ClassVar[int | None] = None
    # Whether the samples' bytes hold their dataset index (tar keys): a part written before the
    # skips of the parts ahead of it were known is then written again with its true first index.
    stores_indices: ClassVar[bool] = False
    fields: dict[str, str] = {}  # noqa: RUF012  # the schema of the fields it stores (with_fields)
    classes: list[str] = []  # noqa: RUF012  # the class names its labels index (with_fields)
    # Appending (packer/edit/append.py): the new samples' first dataset index and first part/shard
    # number, so their files and stored indices follow the dataset's; 0 for a fresh pack.
    index_base: int = 0
    part_base: int = 0
    base_root: Path | None = None  # the dataset appended to (its files are read, never written)

    def __init__(self, fmt: Format, out: Path, spec: PreprocessSpec, options: dict[str, Any]):
        self.format = fmt
        self.out = Path(out)
        self.spec = spec
        self.options = options
        self.check_encoding()
        self.check_options()

    @property
    def name(self) -> str:
        return self.format.name

    def write_file(self, name: str, data: bytes) -> None:
        """Write the output's file ``name`` at the end of a pack, atomically (a remote output
        replaces this, as it does ``move``)."""
        from readers.store.manifest import write_atomic

        write_atomic(self.out / name, data)

    def check_encoding(self) -> None:
        """The encoding must be one the format stores; a format storing one pins it (``--to bmp``
        is ``--encode bmp``): the engine preprocesses with ``self.spec``."""
        encodings = self.format.encodings
        if len(encodings) == 1:
            self.spec = dataclasses.replace(self.spec, encode=encodings[0])
        elif self.spec.encode not in encodings:
            raise ImgpackError(
                f"--to {self.name} does not store --encode {self.spec.encode}; "
                f"use one of {', '.join(encodings)}"
            )

    def check_options(self) -> None:
        """Raise ImgpackError for options this format cannot honour (e.g. raw without a fixed size)."""

    def with_fields(self, schema: dict[str, str], classes: list[str] | None = None) -> FormatWriter:
        """This writer storing the per-sample fields of ``schema`` ({name: kind}) of samples whose
        labels index ``classes`` (a format not declaring ``stores_fields`` was refused them by
        ``registry.refuse_fields``, which names the formats that do)."""
        moved = copy.copy(self)
        moved.fields = dict(schema)
        moved.classes = list(classes if classes is not None else self.classes)
        return moved

    def extending(self, root: Path, samples: int, shards: int) -> FormatWriter:
        """This writer adding to the dataset at ``root`` (``samples`` samples in ``shards``
        shards): its samples and part files are numbered after the dataset's (packer/edit/append.py)."""
        moved = copy.copy(self)
        moved.base_root, moved.index_base, moved.part_base = Path(root), samples, shards
        return moved

    def at(self, out: Path) -> FormatWriter:
        """This writer (its options checked, its spec pinned) writing below ``out`` instead."""
        moved = copy.copy(self)
        moved.out = Path(out)
        return moved

    def samples_per_part(self, num_items: int) -> int:
        shards = self.options.get("shards")
        if shards:
            return max(1, -(-num_items // int(shards)))
        return self.options.get("samples_per_shard") or self.default_samples_per_part or max(1, num_items)

    def parts_hold_kept(self) -> bool:
        """Whether a part holds ``samples_per_part`` kept samples (--samples-per-shard) rather than
        that many source files (--shards: a count of source files per part); packer/engine/_part_plan.py."""
        return not self.options.get("shards")

    def open_part(self, part: int) -> PartWriter:
        raise NotImplementedError

    def part_files(self, part: int) -> list[Path]:
        """Files or directories a part may have left behind (removed before it is redone)."""
        return []

    def part_intact(self, result: PartResult) -> bool:
        """Whether a part recorded as done is still whole (checked on --resume; False: redo it)."""
        return all((self.out / shard.file).exists() for shard in result.shards)

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict[str, Any]]:
        """Final shard list (global ``first``) and format-specific manifest ``extra``."""
        shards: list[Shard] = []
        first = self.index_base
        for result in results:
            for shard in result.shards:
                shards.append(Shard(shard.file, first, shard.count, shard.bytes, shard.sha256))
                first += shard.count
        return shards, {}
