"""WebDataset tar writer: USTAR shards plus DALI-format ``.idx`` files, rolled over by size and count.

A part writes ``part-<part>-<n>.tar`` (+ ``.idx``) files, starting a new one before a sample
would push the current file past ``shard_size`` bytes or ``samples_per_shard`` samples (a file
holds at least one sample, so only a single sample larger than the limit makes a bigger file).
``finish`` renames every part's files, in order, to ``shard-000000.tar``, ``shard-000001.tar``...
Headers are fixed (mtime 0, uid/gid 0, mode 0644, no user names), keys come from the source
index, and the sha256 is computed while writing: the output is byte-identical for any number of
workers or engine. The layout itself is documented in readers/formats/tar.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import BinaryIO

from packer.formats.base import FormatWriter, PartResult, PartWriter
from packer.preprocess import PackedSample
from readers.errors import ImgpackError
from readers.formats.tar import (
    BLOCK,
    Member,
    format_index,
    index_name,
    parse_index,
    sample_key,
    shard_name,
)
from readers.manifest import Shard

DEFAULT_SHARD_SIZE = 512 * 10**6
DEFAULT_SAMPLES_PER_PART = 10_000
END_OF_ARCHIVE = bytes(2 * BLOCK)
IMAGE_EXTS = {"jpeg": "jpg", "png": "png", "bmp": "bmp", "raw": "raw"}
MAGIC = (
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"BM", "bmp"),
    (b"GIF8", "gif"),
    (b"II*\x00", "tif"),
    (b"MM\x00*", "tif"),
)


def image_ext(sample: PackedSample) -> str:
    """The image member's extension: from the encoding, or sniffed from an original file's bytes."""
    if sample.encoding in IMAGE_EXTS:
        return IMAGE_EXTS[sample.encoding]
    head = bytes(sample.data[:12])
    for magic, ext in MAGIC:
        if head.startswith(magic):
            return ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    suffix = sample.rel.rsplit("/", 1)[-1].rpartition(".")[2].lower()
    return suffix if suffix.isalnum() else "bin"


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


def sample_members(sample: PackedSample) -> list[tuple[str, str, bytes]]:
    """(extension, member name, bytes) of one sample, image first."""
    key = sample_key(sample.source_index)
    ext = image_ext(sample)
    meta = {
        "label": sample.label,
        "class": sample.rel.split("/", 1)[0],
        "path": sample.rel,
        "original_size": list(sample.original_size),
        "height": sample.height,
        "width": sample.width,
        "channels": sample.channels,
        "encoding": sample.encoding,
    }
    if sample.encoding == "raw":
        meta["shape"] = [sample.height, sample.width, sample.channels]
    text = json.dumps(meta, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode("ascii")
    return [
        (ext, f"{key}.{ext}", bytes(sample.data)),
        ("cls", f"{key}.cls", str(sample.label).encode("ascii")),
        ("json", f"{key}.json", text),
    ]


class TarPartWriter(PartWriter):
    def __init__(self, out: Path, part: int, shard_size: int, samples_per_shard: int | None):
        self.out = out
        self.part = part
        self.shard_size = shard_size
        self.samples_per_shard = samples_per_shard
        self.shards: list[Shard] = []
        self.files: list[Path] = []
        self.fh: BinaryIO | None = None
        self.samples: list[list[Member]] = []
        self.position = 0
        self.digest = hashlib.sha256()
        self.first = 0

    def _start_file(self) -> None:
        path = self.out / TarWriter.part_file(self.part, len(self.files))
        self.files.append(path)
        self.fh = open(path, "wb")
        self.samples = []
        self.position = 0
        self.digest = hashlib.sha256()

    def _write(self, data: bytes) -> None:
        assert self.fh is not None
        self.fh.write(data)
        self.digest.update(data)
        self.position += len(data)

    def _end_file(self) -> None:
        if self.fh is None:
            return
        self._write(END_OF_ARCHIVE)
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        self.fh = None
        path = self.files[-1]
        with open(path.with_suffix(".idx"), "w", encoding="ascii") as idx:
            idx.write(format_index(self.samples))
        self.shards.append(
            Shard(path.name, self.first, len(self.samples), self.position, self.digest.hexdigest())
        )
        self.first += len(self.samples)

    def add(self, sample: PackedSample) -> None:
        members = sample_members(sample)
        size = sum(BLOCK + padded(len(data)) for _, _, data in members)
        if self.fh is not None and self.samples:
            full = self.samples_per_shard is not None and len(self.samples) >= self.samples_per_shard
            if full or self.position + size + len(END_OF_ARCHIVE) > self.shard_size:
                self._end_file()
        if self.fh is None:
            self._start_file()
        entry: list[Member] = []
        for ext, name, data in members:
            self._write(member_header(name, len(data)))
            entry.append((ext, self.position, len(data), name))
            self._write(data)
            self._write(bytes(padded(len(data)) - len(data)))
        self.samples.append(entry)

    def close(self) -> list[Shard]:
        self._end_file()
        return self.shards

    def abort(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        for path in self.files:
            path.unlink(missing_ok=True)
            path.with_suffix(".idx").unlink(missing_ok=True)


class TarWriter(FormatWriter):
    name = "tar"
    default_samples_per_part = DEFAULT_SAMPLES_PER_PART

    @staticmethod
    def part_file(part: int, number: int) -> str:
        return f"part-{part:06d}-{number:05d}.tar"

    def check_options(self) -> None:
        if self.options.get("compression") not in (None, "none"):
            raise ImgpackError(
                "tar shards are stored uncompressed (the images are compressed already); drop --compression"
            )
        size = self.options.get("shard_size")
        if size is not None and size < 4 * BLOCK:
            raise ImgpackError(f"--shard-size {size} is too small for a tar shard; use e.g. 512MB")

    def open_part(self, part: int) -> TarPartWriter:
        return TarPartWriter(
            self.out,
            part,
            int(self.options.get("shard_size") or DEFAULT_SHARD_SIZE),
            self.options.get("samples_per_shard"),
        )

    def part_files(self, part: int) -> list[Path]:
        return sorted(self.out.glob(f"part-{part:06d}-*.tar")) + sorted(
            self.out.glob(f"part-{part:06d}-*.idx")
        )

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict]:
        """Rename the parts' files to shard-000000.tar... in order; collect the label runs."""
        shards: list[Shard] = []
        runs: list[list[int]] = []
        first = 0
        for result in results:
            for shard in result.shards:
                name = shard_name(len(shards))
                self._rename(shard.file, name)
                self._rename(index_name(shard.file), index_name(name))
                shards.append(Shard(name, first, shard.count, shard.bytes, shard.sha256))
                first += shard.count
                for label in self._labels(name):
                    if runs and runs[-1][0] == label:
                        runs[-1][1] += 1
                    else:
                        runs.append([label, 1])
        return shards, {"index": "webdataset v1.2 (wds2idx)", "label_runs": runs}

    def _rename(self, src: str, dst: str) -> None:
        source, target = self.out / src, self.out / dst
        if source.exists():
            os.replace(source, target)
        elif not target.exists():  # a resumed finish may already have renamed it
            raise ImgpackError(f"{source}: part file vanished before the pack finished; re-run with --force")

    def _labels(self, name: str) -> list[int]:
        """Labels of a written shard, read back from its ``.json`` members."""
        path = self.out / name
        index = parse_index((self.out / index_name(name)).read_text("ascii"), str(path))
        with open(path, "rb") as fh:
            fd = fh.fileno()
            return [
                int(json.loads(os.pread(fd, size, offset))["label"])
                for offset, size in zip(index.json_offset.tolist(), index.json_size.tolist())
            ]


def reindex(dataset: str | os.PathLike) -> list[str]:
    """Rebuild every shard's ``.idx`` of the tar DATASET from the shards; the index files written."""
    from readers.formats.tar import scan_tar
    from readers.manifest import read_manifest, write_atomic

    root = Path(dataset)
    manifest = read_manifest(root)
    if manifest.format != "tar":
        raise ImgpackError(f"{root}: is a {manifest.format} dataset; only tar datasets have .idx files")
    written = []
    for shard in manifest.shards:
        path = root / shard.file
        if not path.is_file():
            raise ImgpackError(f"{path}: shard listed in the manifest is missing; re-pack the dataset")
        with open(path, "rb") as fh:
            samples = scan_tar(fh, str(path))
        if len(samples) != shard.count:
            raise ImgpackError(
                f"{path}: holds {len(samples)} samples but the manifest says {shard.count} "
                "(truncated or replaced?); re-pack the dataset"
            )
        target = root / index_name(shard.file)
        write_atomic(target, format_index(samples))
        os.chmod(target, 0o644)
        written.append(str(target))
    return written
