"""WebDataset tar writer: USTAR shards plus DALI-format ``.idx`` files, rolled over by size and count.

Parts write ``part-<part>-<n>.tar`` (+ ``.idx``) files that ``finish`` renames, in order, to
``shard-000000.tar``, ``shard-000001.tar``... (the rolling and renaming: readers/formats/rolling_writer.py).
Headers are fixed (mtime 0, uid/gid 0, mode 0644, no user names), keys come from the source
index, and the sha256 is computed while writing: the output is byte-identical for any number of
workers or engine. The layout itself is documented in readers/formats/tar.py.
"""

from __future__ import annotations

import json
import os
import tarfile

from readers.errors import ImgpackError
from readers.formats.packed_sample import PackedSample
from readers.formats.rolling_writer import RollingPartWriter, RollingWriter
from readers.formats.tar.reader import (
    BLOCK,
    Member,
    format_index,
    index_name,
    parse_index,
    sample_key,
    shard_name,
)
from readers.formats.writer_base import PartResult, add_label_runs
from readers.store.manifest import Shard

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


def sample_members(
    sample: PackedSample, schema: dict[str, str] | None = None, classes: list[str] | None = None
) -> list[tuple[str, str, bytes]]:
    """(extension, member name, bytes) of one sample, image first. The ``.json`` "class" is the
    name of the label's class (null for -1): for an image folder, the sample's class folder."""
    key = sample_key(sample.dataset_index)
    ext = image_ext(sample)
    meta = {
        "label": sample.label,
        "class": class_name(sample, classes),
        "path": sample.rel,
        "original_size": list(sample.original_size),
        "height": sample.height,
        "width": sample.width,
        "channels": sample.channels,
        "encoding": sample.encoding,
    }
    if sample.encoding == "raw":
        meta["shape"] = [sample.height, sample.width, sample.channels]
    members = [
        (ext, f"{key}.{ext}", bytes(sample.data)),
        ("cls", f"{key}.cls", str(sample.label).encode("ascii")),
    ]
    if sample.fields:
        # Every field in the .json member (what the reader reads back); the caption (the string
        # field named "caption", or the one string field) also as .txt, as webdataset expects.
        values = json.loads(sample.fields)
        meta["fields"] = values
        caption = caption_field(schema or {})
        if caption is not None and isinstance(values.get(caption), str):
            members.append(("txt", f"{key}.txt", values[caption].encode("utf-8")))
    text = json.dumps(meta, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode("ascii")
    members.append(("json", f"{key}.json", text))
    return members


def class_name(sample: PackedSample, classes: list[str] | None) -> str | None:
    return classes[sample.label] if classes and 0 <= sample.label < len(classes) else None


def caption_field(schema: dict[str, str]) -> str | None:
    """The string field stored as the ``.txt`` member: "caption", else the only string field."""
    strings = [name for name, kind in schema.items() if kind == "str"]
    if "caption" in strings:
        return "caption"
    return strings[0] if len(strings) == 1 else None


class TarPartWriter(RollingPartWriter):
    suffix = ".tar"
    trailer = END_OF_ARCHIVE

    def encode(self, sample: PackedSample) -> tuple[bytes, list[Member]]:
        chunks: list[bytes] = []
        members: list[Member] = []
        position = 0
        for ext, name, data in sample_members(sample, self.fields, self.classes):
            header = member_header(name, len(data))
            members.append((ext, position + len(header), len(data), name))
            chunks += [header, data, bytes(padded(len(data)) - len(data))]
            position += len(header) + padded(len(data))
        return b"".join(chunks), members

    def index_text(self, entries: list[tuple[int, list[Member]]]) -> str:
        return format_index(
            [
                [(ext, base + offset, size, name) for ext, offset, size, name in members]
                for base, members in entries
            ]
        )


class TarWriter(RollingWriter):
    stores_indices = True
    part_writer = TarPartWriter

    def shard_name(self, position: int) -> str:
        return shard_name(position)

    def check_options(self) -> None:
        size = self.options.get("shard_size")
        if size is not None and size < 4 * BLOCK:
            raise ImgpackError(f"--shard-size {size} is too small for a tar shard; use e.g. 512MB")

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict]:
        """Rename the parts' files to shard-000000.tar... in order; write the label file."""
        shards = self.place_shards(results)
        runs: list[list[int]] = []
        if all("label_runs" in result.extra for result in results):
            for result in results:
                add_label_runs(runs, result.extra["label_runs"], counted=True)
        else:  # parts finished by an imgpack that did not record their labels
            for shard in shards:
                add_label_runs(runs, self._labels(shard.file))
        return shards, {"index": "webdataset v1.2 (wds2idx)", **self.label_file(runs)}

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


def shard_index(fileobj, where: str) -> tuple[int, str]:
    """(samples, index text) of one tar shard, read from the shard itself (``pack reindex``)."""
    from readers.formats.tar.reader import scan_tar

    samples = scan_tar(fileobj, where)
    return len(samples), format_index(samples)
