"""TFRecord writer: ``tf.train.Example`` shards plus DALI ``tfrecord2idx`` indexes, rolled over like tar.

A part writes ``part-<part>-<n>.tfrecord`` (+ ``.idx``) files, starting a new one before a
sample would push the current file past ``shard_size`` bytes or ``samples_per_shard`` samples;
``finish`` renames them, in order, to ``shard-000000.tfrecord``... Each part remembers its
labels as runs (kept in the progress file with the part), so ``finish`` records the dataset's
``label_runs`` without reading the shards back. The bytes depend only on the samples, so the
output is identical for any number of workers or engine. The layout is documented in
readers/formats/tfrecord.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

from packer.formats.base import FormatWriter, PartResult, PartWriter, add_label_runs
from packer.formats.tar import DEFAULT_SAMPLES_PER_PART, DEFAULT_SHARD_SIZE, image_ext
from packer.preprocess import PackedSample
from readers.errors import ImgpackError
from readers.formats.tfexample import encode_example
from readers.formats.tfrecord import FORMAT_NAMES, format_index, frame, index_name, shard_name
from readers.manifest import Shard


def example_bytes(sample: PackedSample) -> bytes:
    """The serialized ``tf.train.Example`` of one sample (ImageNet conversion feature names)."""
    image_format = FORMAT_NAMES.get(sample.encoding) or image_ext(sample).upper()
    return encode_example(
        {
            "image/encoded": sample.data,
            "image/format": image_format,
            "image/height": sample.height,
            "image/width": sample.width,
            "image/channels": sample.channels,
            "image/colorspace": "L" if sample.channels == 1 else "RGB",
            "image/class/label": sample.label,
            "image/filename": sample.rel,
        }
    )


class TfrecordPartWriter(PartWriter):
    def __init__(self, out: Path, part: int, shard_size: int, samples_per_shard: int | None):
        self.out = out
        self.part = part
        self.shard_size = shard_size
        self.samples_per_shard = samples_per_shard
        self.shards: list[Shard] = []
        self.files: list[Path] = []
        self.fh: BinaryIO | None = None
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.position = 0
        self.digest = hashlib.sha256()
        self.first = 0
        self.label_runs: list[list[int]] = []

    def _start_file(self) -> None:
        path = self.out / TfrecordWriter.part_file(self.part, len(self.files))
        self.files.append(path)
        self.fh = open(path, "wb")
        self.offsets, self.sizes = [], []
        self.position = 0
        self.digest = hashlib.sha256()

    def _end_file(self) -> None:
        if self.fh is None:
            return
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        self.fh = None
        path = self.files[-1]
        with open(self.out / index_name(path.name), "w", encoding="ascii") as idx:
            idx.write(format_index(self.offsets, self.sizes))
        self.shards.append(
            Shard(path.name, self.first, len(self.offsets), self.position, self.digest.hexdigest())
        )
        self.first += len(self.offsets)

    def add(self, sample: PackedSample) -> None:
        record = frame(example_bytes(sample))
        if self.fh is not None and self.offsets:
            full = self.samples_per_shard is not None and len(self.offsets) >= self.samples_per_shard
            if full or self.position + len(record) > self.shard_size:
                self._end_file()
        if self.fh is None:
            self._start_file()
        assert self.fh is not None
        self.fh.write(record)
        self.digest.update(record)
        self.offsets.append(self.position)
        self.sizes.append(len(record))
        self.position += len(record)
        add_label_runs(self.label_runs, [sample.label])

    def close(self) -> list[Shard]:
        self._end_file()
        return self.shards

    def summary(self) -> dict[str, Any]:
        return {"label_runs": self.label_runs}

    def abort(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        for path in self.files:
            path.unlink(missing_ok=True)
            (self.out / index_name(path.name)).unlink(missing_ok=True)


class TfrecordWriter(FormatWriter):
    name = "tfrecord"
    default_samples_per_part = DEFAULT_SAMPLES_PER_PART

    @staticmethod
    def part_file(part: int, number: int) -> str:
        return f"part-{part:06d}-{number:05d}.tfrecord"

    def check_options(self) -> None:
        if self.options.get("compression") not in (None, "none"):
            raise ImgpackError(
                "TFRecord shards are stored uncompressed (images are compressed already); drop --compression"
            )

    def open_part(self, part: int) -> TfrecordPartWriter:
        return TfrecordPartWriter(
            self.out,
            part,
            int(self.options.get("shard_size") or DEFAULT_SHARD_SIZE),
            self.options.get("samples_per_shard"),
        )

    def part_files(self, part: int) -> list[Path]:
        return sorted(self.out.glob(f"part-{part:06d}-*.tfrecord")) + sorted(
            self.out.glob(f"part-{part:06d}-*.idx")
        )

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict]:
        shards: list[Shard] = []
        runs: list[list[int]] = []
        first = 0
        for result in results:
            for shard in result.shards:
                name = shard_name(len(shards))
                for src, dst in ((shard.file, name), (index_name(shard.file), index_name(name))):
                    source, target = self.out / src, self.out / dst
                    if source.exists():
                        os.replace(source, target)
                    elif not target.exists():  # a resumed finish may already have renamed it
                        raise ImgpackError(
                            f"{source}: part file vanished before the pack finished; use --force"
                        )
                shards.append(Shard(name, first, shard.count, shard.bytes, shard.sha256))
                first += shard.count
            add_label_runs(runs, result.extra.get("label_runs", []), counted=True)
        return shards, {"index": "tfrecord2idx", "label_runs": runs}
