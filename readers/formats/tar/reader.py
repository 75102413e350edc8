"""WebDataset tar shards ``shard-000000.tar`` with DALI-format sidecar indexes ``shard-000000.idx``.

On-disk layout (shared with writer.py beside it):
- a shard is a plain USTAR archive (mtime 0, uid/gid 0, no PAX headers); each sample is three
  adjacent members ``<key>.<ext>`` (the image: jpg, png, bmp, raw, or the sniffed type of an
  original file), ``<key>.cls`` (the label in ASCII) and ``<key>.json`` (label, class name or null,
  source path, original size, stored height/width/channels); ``key`` is ``s`` + the sample's dataset index
  (no gaps where a source file was skipped; no dots), so WebDataset and DALI group the members into samples;
- ``shard-000000.idx`` is the text index DALI's ``wds2idx`` writes (version ``v1.2``): a line
  ``v1.2 <samples>``, then per sample ``<ext> <data offset> <size> <member name>`` for each
  member, in archive order. imgpack parses it once per process and reads a sample, or a block of
  consecutive samples, with one ``pread`` of the byte range covering their members.

Shards can also live behind any fsspec URL (see readers/remote/remote_parts.py): read with ranged
requests, or (with a ``cache_dir``) downloaded whole into it and read from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from readers.errors import ChecksumError, ManifestError, warn
from readers.formats.base import FormatReader
from readers.formats.part_files import open_shard_file
from readers.remote.readahead import Extent, open_parts
from readers.remote.urls import remote_call, remote_chunks
from readers.store.checksums import check_against_manifest
from readers.store.manifest import Shard
from readers.store.record import Record

INDEX_VERSION = "v1.2"
BLOCK = 512
META_EXTS = ("cls", "json")


def shard_name(position: int) -> str:
    return f"shard-{position:06d}.tar"


def index_name(tar_name: str) -> str:
    return tar_name[: -len(".tar")] + ".idx" if tar_name.endswith(".tar") else tar_name + ".idx"


def sample_key(dataset_index: int) -> str:
    return f"s{dataset_index:09d}"


def split_member(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key ends at the first dot of the last path component."""
    dot = name.find(".", name.rfind("/") + 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1 :])


Member = tuple[str, int, int, str]  # (extension, data offset, size, member name)


def format_index(samples: list[list[Member]]) -> str:
    """The index text for a shard's samples, exactly as DALI's ``wds2idx`` writes it."""
    lines = [f"{INDEX_VERSION} {len(samples)}"]
    lines += [" ".join(f"{ext} {offset} {size} {name}" for ext, offset, size, name in s) for s in samples]
    return "\n".join(lines) + "\n"


def scan_tar(fileobj: IO[bytes], where: str = "tar shard") -> list[list[Member]]:
    """Samples of a tar stream (regular files grouped by key), for rebuilding a lost index."""
    samples: list[list[Member]] = []
    last_key = None
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as archive:
            for info in archive:
                if not info.isreg():
                    continue
                if any(c.isspace() for c in info.name):
                    raise ManifestError(
                        f"{where}: member {info.name!r} has white space in its name, which the DALI "
                        "wds2idx index (space-separated fields) cannot hold; rename the members "
                        "(keys and extensions without spaces) or re-pack the images with `pack imagefolder`"
                    )
                key, ext = split_member(info.name)
                if not key or key.endswith("/"):
                    continue
                if key != last_key:
                    samples.append([])
                    last_key = key
                samples[-1].append((ext, info.offset_data, info.size, info.name))
    except (tarfile.TarError, EOFError) as exc:
        raise ManifestError(
            f"{where}: not a readable tar archive ({exc}); the shard is truncated or corrupt, "
            "copy it again or re-pack the dataset"
        ) from None
    return samples


@dataclass
class ShardIndex:
    """Byte ranges of every sample's members in one shard (arrays indexed by local position)."""

    image_offset: np.ndarray
    image_size: np.ndarray
    json_offset: np.ndarray
    json_size: np.ndarray

    @property
    def end(self) -> np.ndarray:
        return self.json_offset + self.json_size

    def __len__(self) -> int:
        return len(self.image_offset)


def parse_index(text: str, where: str) -> ShardIndex:
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] != INDEX_VERSION or not head[1].isdigit():
        raise ManifestError(
            f"{where}: not a {INDEX_VERSION} webdataset index; rebuild it with `pack reindex DATASET`"
        )
    count = int(head[1])
    if count > len(lines) - 1:  # before allocating: a corrupt count must not exhaust memory
        raise ManifestError(
            f"{where}: index says {count} samples but has {len(lines) - 1} lines; "
            "rebuild it with `pack reindex DATASET`"
        )
    rows = np.zeros((count, 4), dtype=np.int64)
    try:
        for i, line in enumerate(lines[1 : count + 1]):
            fields = line.split()
            image = json_member = None
            for j in range(0, len(fields), 4):
                ext = fields[j]
                if ext == "json":
                    json_member = fields[j + 1 : j + 3]
                elif ext != "cls" and image is None:
                    image = fields[j + 1 : j + 3]
            rows[i] = (*image, *json_member)  # type: ignore[misc]
        image_end, json_end = rows[:, 0] + rows[:, 1], rows[:, 2] + rows[:, 3]
        if (rows < 0).any() or (image_end > rows[:, 2]).any() or (rows[1:, 0] < json_end[:-1]).any():
            raise ValueError("member byte ranges are negative or out of order")
    except (TypeError, ValueError, IndexError) as exc:
        raise ManifestError(
            f"{where}: malformed index ({exc}); rebuild it with `pack reindex DATASET`"
        ) from None
    return ShardIndex(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])


class _OpenShard:
    """One shard in this process: its index and a way to read byte ranges of it."""

    def __init__(
        self, index: ShardIndex, fd: int | None = None, parts: Any = None, name: str = "", url: str = ""
    ):
        self.index = index
        self.fd = fd
        self.parts = parts  # a remote shard: RemoteParts, whose session is made at the first read
        self.name = name
        self.url = url

    def read(self, offset: int, length: int) -> bytes:
        if self.fd is not None:
            return os.pread(self.fd, length, offset)
        fs, remote, end = self.parts.fs[0], self.parts.remote_path(self.name), offset + length
        return remote_call(self.url, "reading", fs.cat_file, remote, start=offset, end=end)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TarReader(FormatReader):
    checks_shards_on_open = True

    # -- where things are ---------------------------------------------------------------------
    def check_parts(self) -> None:
        """Each shard's index lists the manifest's sample count (shards are checked when opened,
        so the others of a dataset with one damaged shard stay readable)."""
        for shard in self.manifest.shards:
            idx = self.location(index_name(shard.file))
            try:
                with open(idx, encoding="ascii", errors="replace") as fh:
                    head = fh.readline(64).split()
            except FileNotFoundError:
                continue  # rebuilt from the shard (with a warning) when the shard is opened
            if len(head) == 2 and head[1].isdigit() and int(head[1]) != shard.count:
                raise ManifestError(
                    f"{idx}: index lists {head[1]} samples but the manifest says {shard.count} "
                    f"for {shard.file}; rebuild it with `pack reindex {self.root}` or re-pack"
                )

    def checksum_path(self, shard: Shard):
        return self.location(shard.file)  # tar shards may be read remotely by ranges, uncached

    # -- opening a shard ----------------------------------------------------------------------
    def _open(self, position: int) -> Any:
        shard = self.manifest.shards[position]
        where = self.location(shard.file)
        if self.parts is None:
            return self._open_local(shard, where)
        if self.cache_dir is not None:  # whole shards in the cache; else ranged requests
            return self._open_local(shard, where, local_path=self.local_file(shard), verified=True)
        parts = self.parts
        open_tar = lambda: parts.fs[0].open(parts.remote_path(shard.file), "rb")  # noqa: E731
        if self.verify:  # hashed and indexed in each process that opens it
            digest = hashlib.sha256()
            for chunk in remote_chunks(parts.fs[0], parts.remote_path(shard.file), where, "reading"):
                digest.update(chunk)
            self._check_sha(shard, where, digest.hexdigest())
            index = self._load_index(shard, where, open_tar)
        else:
            # Kept across a fork: a DataLoader worker reads the indexes its main process read
            # before forking it (readers/remote/prime.py) without a request or a session of its own.
            indexes = self.__dict__.setdefault("_remote_indexes", {})
            index = indexes.get(position)
            if index is None:
                index = indexes[position] = self._load_index(shard, where, open_tar)
        return _OpenShard(index, parts=parts, name=shard.file, url=where)

    def _open_local(self, shard: Shard, where: str, local_path: str = "", verified: bool = False):
        path = local_path or where

        def load_index() -> ShardIndex:
            if not verified:  # hashed once per process (pack verify has done it already)
                self.check_sha256(path, shard.sha256, where)
            return self._load_index(shard, where, lambda: open(path, "rb"))

        fd, index = open_shard_file(path, shard, False, load_index, where)
        return _OpenShard(index, fd=fd)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_remote_indexes", None)  # a pickled copy reads its own: the pickle stays small
        return state

    def _check_sha(self, shard: Shard, where: str, actual: str) -> None:
        check_against_manifest(where, actual, shard.sha256)

    def sidecar_names(self, shard: Shard) -> list[str]:
        return [index_name(shard.file)] if self.cache_dir is not None else []  # else a ranged read

    def _load_index(self, shard: Shard, where: str, open_tar) -> ShardIndex:
        idx_where = self.location(index_name(shard.file))

        def checked(text: str, idx: str) -> ShardIndex:
            return self._checked_index(shard, where, open_tar, text, idx)

        try:
            if self.parts is not None:
                if self.cache_dir is not None:  # a damaged cached copy is fetched again
                    return self.parts.index(index_name(shard.file), shard.sha256, checked)
                text = self.parts.read(index_name(shard.file)).decode("ascii", "replace")
            else:
                with open(idx_where, encoding="ascii", errors="replace") as fh:
                    text = fh.read()
        except FileNotFoundError:
            fix = (
                "run `pack reindex` on a local copy and upload the .idx files"
                if self.remote
                else f"write it back with `pack reindex {self.root}`"
            )
            warn(f"{idx_where}: index missing; rebuilding it from the shard (slow); {fix}")
            with open_tar() as fh:
                text = format_index(scan_tar(fh, where))
        return checked(text, idx_where)

    def _checked_index(self, shard: Shard, where: str, open_tar, text: str, idx_where: str) -> ShardIndex:
        index = parse_index(text, idx_where)
        if self.verify:  # the .idx has no checksum of its own: it must agree with the shard
            with open_tar() as fh:
                actual = parse_index(format_index(scan_tar(fh, where)), where)
            if not all(np.array_equal(a, b) for a, b in zip(vars(index).values(), vars(actual).values())):
                raise ChecksumError(
                    f"{idx_where}: index does not match the members of {where} (corrupt or modified); "
                    f"rebuild it with `pack reindex {self.root}`"
                )
        if len(index) != shard.count:
            raise ManifestError(
                f"{idx_where}: index lists {len(index)} samples but the manifest says {shard.count} "
                f"for {shard.file}; rebuild it with `pack reindex {self.root}`"
            )
        if len(index) and int(index.end[-1]) > shard.bytes:
            raise ManifestError(f"{idx_where}: index points past the end of {where}; rebuild it")
        return index

    def _close_handle(self, handle) -> None:
        if isinstance(handle, _OpenShard):
            handle.close()

    # -- reading ------------------------------------------------------------------------------
    def byte_range(self, opened: _OpenShard, a: int, b: int) -> tuple[int, int]:
        """Where the members of local records [a, b) of an open shard lie: [start, end)."""
        return int(opened.index.image_offset[a]), int(opened.index.end[b - 1])

    def byte_ranges(self, position: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``byte_range`` for arrays of local records [a, b) of shard ``position`` (opened)."""
        index = self.handle(position).index
        return index.image_offset[a].astype(np.int64), index.end[b - 1].astype(np.int64)

    def prime_ranges(self, rank: Any, settings: Any) -> list[Any]:
        from readers.remote.prime import range_jobs

        return range_jobs(self, rank, settings)

    def fetch_ranges_ahead(self, planned: list[np.ndarray], settings: Any, rank: Any = None) -> Any:
        from readers.remote.remote_ahead import ranges_ahead

        return ranges_ahead(self, planned, settings, rank)

    def extents(self, indices) -> list[Extent] | None:
        parts = open_parts(self, indices)
        if parts is None:
            return None
        out: list[Extent] = []
        for _, opened, local in parts:
            if opened.fd is not None:  # a local shard (remote ones are fetched by ranges)
                starts = opened.index.image_offset[local]
                out.append(Extent(opened.fd, starts, opened.index.end[local] - starts))
        return out

    def read_local(self, position: int, a: int, b: int) -> list[Record]:
        """Records at local positions [a, b) of shard ``position``, with one pread."""
        shard = self.manifest.shards[position]
        opened: _OpenShard = self.handle(position)
        index = opened.index
        base, end = self.byte_range(opened, a, b)
        length = end - base
        data = None if self.ahead is None else self.ahead.take(position, base, end)
        if data is None:
            data = opened.read(base, length)
        if len(data) != length:
            raise ManifestError(
                f"{self.location(shard.file)}: shard is truncated (short read at byte {base}); "
                "copy it again or re-pack the dataset"
            )
        view = memoryview(data)
        records = []
        encoding = self.manifest.encoding
        offsets = (index.image_offset[a:b] - base).tolist()
        sizes = index.image_size[a:b].tolist()
        json_offsets = (index.json_offset[a:b] - base).tolist()
        json_sizes = index.json_size[a:b].tolist()
        for off, size, joff, jsize in zip(offsets, sizes, json_offsets, json_sizes):
            try:
                meta = json.loads(bytes(view[joff : joff + jsize]))
                fields = [meta[k] for k in ("label", "height", "width", "channels")]
                lows = (self.lowest_label, 0, 0, 0)  # a label of -1 is "no class"; a shape is not
                if not all(type(v) is int and v >= low for v, low in zip(fields, lows)):
                    raise ValueError(f"label and shape must be integers, got {fields}")
                label, height, width, channels = fields
                stored = meta.get("fields", {}) if self.manifest.fields else None
                image = view[off : off + size]
                records.append(Record(image, label, height, width, channels, encoding, stored))
            except (ValueError, KeyError, TypeError) as exc:
                raise ManifestError(
                    f"{self.location(shard.file)}: sample {shard.first + a + len(records)} has unreadable "
                    f"metadata ({exc}); the shard or its index is corrupt, run `pack verify`"
                ) from None
        return records
