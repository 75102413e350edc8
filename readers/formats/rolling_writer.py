"""Shard files that roll over by size and count, each with an index beside it (tar, tfrecord).

A part writes ``part-<part>-<n><suffix>`` files (+ ``.idx``), starting a new one before a sample
would push the current file past ``shard_size`` bytes or ``samples_per_shard`` samples (a file
holds at least one sample, so only a single sample larger than the limit makes a bigger file).
The sha256 is computed while writing; each part also records its labels as runs (kept with the
part in the progress file). ``finish`` renames every part's files, in order, to the dataset's
shard names, and writes every label into one label file (readers/formats/label_file.py). A
format says how a sample is encoded and how its index is written; ``pack reindex`` rebuilds the
indexes from the shards (packer/info/reindex.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from readers.errors import ImgpackError
from readers.formats.label_file import LABELS_DTYPE, LABELS_NAME, labels_entry
from readers.formats.packed_sample import PackedSample
from readers.formats.writer_base import FormatWriter, PartResult, PartWriter, add_label_runs
from readers.store.manifest import Shard

DEFAULT_SHARD_SIZE = 512 * 10**6
DEFAULT_SAMPLES_PER_PART = 10_000


def index_path(data_file: Path) -> Path:
    return data_file.with_suffix(".idx")


class RollingPartWriter(PartWriter):
    suffix: ClassVar[str] = ""
    trailer: ClassVar[bytes] = b""  # closes every file (tar: the end-of-archive blocks)

    def __init__(self, out: Path, part: int, shard_size: int, samples_per_shard: int | None):
        self.out = out
        self.part = part
        self.shard_size = shard_size
        self.samples_per_shard = samples_per_shard
        self.shards: list[Shard] = []
        self.files: list[Path] = []
        self.fh: BinaryIO | None = None
        self.entries: list[tuple[int, Any]] = []  # (position of the sample in the file, its entry)
        self.position = 0
        self.digest = hashlib.sha256()
        self.first = 0
        self.label_runs: list[list[int]] = []

    # -- what a format says -------------------------------------------------------------------
    def encode(self, sample: PackedSample) -> tuple[bytes, Any]:
        """The sample's bytes in the file and its index entry (positions relative to its start)."""
        raise NotImplementedError

    def index_text(self, entries: list[tuple[int, Any]]) -> str:
        raise NotImplementedError

    # -- the files ----------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        assert self.fh is not None
        self.fh.write(data)
        self.digest.update(data)
        self.position += len(data)

    def _start_file(self) -> None:
        path = self.out / f"part-{self.part:06d}-{len(self.files):05d}{self.suffix}"
        self.files.append(path)
        self.fh = open(path, "wb")
        self.entries = []
        self.position = 0
        self.digest = hashlib.sha256()

    def _end_file(self) -> None:
        if self.fh is None:
            return
        self._write(self.trailer)
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        self.fh = None
        path = self.files[-1]
        with open(index_path(path), "w", encoding="ascii") as idx:
            idx.write(self.index_text(self.entries))
        count = len(self.entries)
        self.shards.append(Shard(path.name, self.first, count, self.position, self.digest.hexdigest()))
        self.first += count

    def add(self, sample: PackedSample) -> None:
        data, entry = self.encode(sample)
        if self.fh is not None and self.entries:
            full = self.samples_per_shard is not None and len(self.entries) >= self.samples_per_shard
            if full or self.position + len(data) + len(self.trailer) > self.shard_size:
                self._end_file()
        if self.fh is None:
            self._start_file()
        self.entries.append((self.position, entry))
        self._write(data)
        add_label_runs(self.label_runs, [sample.label])

    def close(self) -> list[Shard]:
        self._end_file()
        return self.shards

    def summary(self) -> dict[str, Any]:
        return {"label_runs": self.label_runs}

    def abort(self) -> None:
        if self.fh is not None:
            fh, self.fh = self.fh, None
            try:
                fh.close()  # flushing the buffered rest fails again on a full disk; the file goes anyway
            except OSError:
                pass
        for path in self.files:
            path.unlink(missing_ok=True)
            index_path(path).unlink(missing_ok=True)


class RollingWriter(FormatWriter):
    part_writer: ClassVar[type[RollingPartWriter]] = RollingPartWriter
    default_samples_per_part = DEFAULT_SAMPLES_PER_PART

    def shard_name(self, position: int) -> str:
        raise NotImplementedError

    def open_part(self, part: int) -> RollingPartWriter:
        return self.part_writer(
            self.out,
            part,
            int(self.options.get("shard_size") or DEFAULT_SHARD_SIZE),
            self.options.get("samples_per_shard"),
        )

    def part_files(self, part: int) -> list[Path]:
        prefix = f"part-{part:06d}-"
        return sorted(self.out.glob(prefix + "*" + self.part_writer.suffix)) + sorted(
            self.out.glob(prefix + "*.idx")
        )

    def move(self, src: str | Path, dst: str | Path) -> None:
        """Rename the output's file ``src`` to ``dst`` (a remote output replaces this)."""
        source, target = self.out / src, self.out / dst
        if source.exists():
            os.replace(source, target)
        elif not target.exists():  # a resumed finish may already have renamed it
            raise ImgpackError(f"{source}: part file vanished before the pack finished; re-run with --force")

    def label_file(self, runs: list[list[int]]) -> dict[str, Any]:
        """Write every sample's label (``runs``: [label, count] pairs) as the format's label
        file; its manifest ``extra`` entry (readers/formats/label_file.py)."""
        table = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        data = np.repeat(table[:, 0], table[:, 1]).astype(LABELS_DTYPE).tobytes()
        self.write_file(LABELS_NAME, data)
        return {"labels": labels_entry(data)}

    def place_shards(self, results: list[PartResult]) -> list[Shard]:
        """Rename the parts' files (and indexes) to the shard names, in order; the final shards."""
        shards: list[Shard] = []
        first = self.index_base
        for result in results:
            for shard in result.shards:
                name = self.shard_name(self.part_base + len(shards))
                for src, dst in ((shard.file, name), (index_path(Path(shard.file)), index_path(Path(name)))):
                    self.move(src, dst)
                shards.append(Shard(name, first, shard.count, shard.bytes, shard.sha256))
                first += shard.count
        return shards
