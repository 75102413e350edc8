"""HDF5 writer: one ``.h5`` file per part, written through resizable datasets.

The layout is described with the reader (readers/formats/hdf5.py) and in docs/formats.md. Samples are
buffered up to ``FLUSH_BYTES`` / ``FLUSH_SAMPLES`` and appended with one resize and one slice
write per dataset, so memory stays bounded whatever the dataset size. The dataset manifest is
put into each file's attributes by ``finish`` (only then are classes and global positions known),
which is also why the files are checksummed there rather than when a part closes.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from readers.errors import ImgpackError
from readers.formats.hdf5.reader import FLAT_CHUNK_BYTES, LAYOUT_VERSION, MANIFEST_ATTR, shard_name
from readers.formats.packed_sample import PackedSample, PreprocessSpec
from readers.formats.writer_base import FormatWriter, PartResult, PartWriter
from readers.store.checksums import file_sha256
from readers.store.manifest import FORMAT_VERSION, Shard, imgpack_version, json_text
from readers.store.record import record_crc

FLUSH_BYTES = 32 << 20
FLUSH_SAMPLES = 256
SPACE_MARGIN = 4 << 20  # room kept for HDF5's metadata and index chunks
COMPRESSIONS = ("none", "lzf", "gzip")
GZIP_LEVEL = 4
KEY_DTYPE = h5py.string_dtype("utf-8")


def _filters(compression: str | None) -> dict[str, Any]:
    if compression in (None, "none"):
        return {}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": GZIP_LEVEL}
    return {"compression": compression}


class Hdf5PartWriter(PartWriter):
    def __init__(self, path: Path, spec: PreprocessSpec, compression: str | None):
        self.path = path
        path.unlink(missing_ok=True)
        # libver v108+: attributes over 64 KiB (a manifest with many classes) are stored densely.
        self.file = h5py.File(path, "w", libver=("v108", "latest"), rdcc_nbytes=8 << 20)
        self.raw = spec.encode == "raw"
        self.encoding = spec.encode
        filters = _filters(compression)
        if self.raw:
            assert spec.fixed_size is not None  # Hdf5Writer.check_options refuses raw without one
            height, width = spec.fixed_size
            self.shape = (height, width, spec.channels)
            self.images = self.file.create_dataset(
                "images", (0, *self.shape), np.uint8, maxshape=(None, *self.shape),
                chunks=(1, *self.shape), **filters,
            )  # fmt: skip
        else:
            self.images = self.file.create_dataset(
                "images", (0,), np.uint8, maxshape=(None,), chunks=(FLAT_CHUNK_BYTES,), **filters
            )
            self.offsets = self._vector("offsets", np.int64)
            self.offsets.resize((1,))
            self.offsets[0] = 0
            self.shapes = self.file.create_dataset(
                "shapes", (0, 3), np.int32, maxshape=(None, 3), chunks=(16384, 3)
            )
        self.labels = self._vector("labels", np.int64)
        self.crc = self._vector("crc32", np.uint32)
        self.keys = self._vector("keys", KEY_DTYPE)
        self.count = 0
        self.nbytes = 0
        self.pending: list[PackedSample] = []
        self.pending_bytes = 0
        self.closing = False

    def _vector(self, name: str, dtype: Any) -> h5py.Dataset:
        return self.file.create_dataset(name, (0,), dtype, maxshape=(None,), chunks=(16384,))

    def add(self, sample: PackedSample) -> None:
        if self.raw and (sample.height, sample.width, sample.channels) != self.shape:
            raise ImgpackError(
                f"{sample.rel}: raw image of {sample.height}x{sample.width}x{sample.channels} does not fit "
                f"the {'x'.join(map(str, self.shape))} HDF5 array"
            )
        self.pending.append(sample)
        self.pending_bytes += len(sample.data)
        if len(self.pending) >= FLUSH_SAMPLES or self.pending_bytes >= FLUSH_BYTES:
            self._flush()

    @staticmethod
    def _append(dataset: h5py.Dataset, values: Any, at: int) -> None:
        dataset.resize(at + len(values), axis=0)
        dataset[at:] = values

    def _ensure_space(self, nbytes: int) -> None:
        """Raise ENOSPC before HDF5 sees it: after a failed write, HDF5 cannot close the file
        cleanly and the process crashes when h5py's objects are collected."""
        free = shutil.disk_usage(self.path.parent).free
        if free < nbytes + SPACE_MARGIN:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    def _flush(self) -> None:
        batch = self.pending
        if not batch:
            return
        n = self.count
        blob = b"".join(bytes(s.data) for s in batch)
        self._ensure_space(len(blob) + len(batch) * 64)
        if self.raw:
            self._append(self.images, np.frombuffer(blob, np.uint8).reshape(len(batch), *self.shape), n)
        else:
            self._append(self.images, np.frombuffer(blob, np.uint8), self.nbytes)
            ends = self.nbytes + np.cumsum([len(s.data) for s in batch], dtype=np.int64)
            self._append(self.offsets, ends, n + 1)
            self._append(self.shapes, np.array([(s.height, s.width, s.channels) for s in batch], np.int32), n)
        self._append(self.labels, np.array([s.label for s in batch], np.int64), n)
        stored = [s.fields.encode() for s in batch]
        if self.fields:
            if "fields" not in self.file:
                self._vector("fields", KEY_DTYPE)
            self._append(self.file["fields"], np.array([t.decode() for t in stored], dtype=object), n)
        crcs = [
            record_crc(s.data, s.label, s.height, s.width, s.channels, self.encoding, f)
            for s, f in zip(batch, stored)
        ]
        self._append(self.crc, np.array(crcs, np.uint32), n)
        keys = [s.rel.encode("utf-8", "surrogateescape") for s in batch]
        self._append(self.keys, np.array(keys, dtype=object), n)
        self.count += len(batch)
        self.nbytes += len(blob)
        self.pending = []
        self.pending_bytes = 0

    def close(self) -> list[Shard]:
        try:
            self._flush()
            self._ensure_space(0)
            self.file.attrs["encoding"] = self.encoding
            self.file.attrs["layout"] = "array" if self.raw else "flat"
            self.file.attrs["layout_version"] = LAYOUT_VERSION
            self.file.attrs["count"] = self.count
        finally:
            self.closing = True  # a second close of a file whose close failed crashes HDF5
            self.file.close()
        # Checksummed in finish(), after the manifest attribute is added.
        return [Shard(self.path.name, 0, self.count, self.path.stat().st_size, "")]

    def abort(self) -> None:
        # Empty the file first: after a failed write (disk full) the close must be able to flush
        # its metadata, or the HDF5 library is left broken and crashes the process at exit.
        try:
            os.truncate(self.path, 0)
        except OSError:
            pass
        try:
            if not self.closing:
                self.file.close()
        except (OSError, RuntimeError):
            pass
        finally:
            self.path.unlink(missing_ok=True)


class Hdf5Writer(FormatWriter):

    def check_options(self) -> None:
        compression = self.options.get("compression")
        if compression not in (None, *COMPRESSIONS):
            raise ImgpackError(f"--compression {compression}: use one of {', '.join(COMPRESSIONS)}")
        if self.spec.encode == "raw" and self.spec.fixed_size is None:
            raise ImgpackError(
                "--to hdf5 --encode raw stores one (N, H, W, C) array, so every image needs the same "
                "size: add --crop N, or --resize N --resize-mode exact"
            )

    def open_part(self, part: int) -> Hdf5PartWriter:
        return Hdf5PartWriter(self.out / shard_name(part), self.spec, self.options.get("compression"))

    def part_files(self, part: int) -> list[Path]:
        return [self.out / shard_name(part)]

    def part_intact(self, result: PartResult) -> bool:
        """A kill while ``finish`` rewrites a file's attributes can leave its metadata unreadable
        ("addr overflow"); such a part is redone rather than failing every resume."""
        for shard in result.shards:
            try:
                with h5py.File(self.out / shard.file, "r") as fh:
                    if int(fh.attrs["count"]) != shard.count:
                        return False
                    dict(fh.attrs)
                    for name in fh:
                        fh[name].shape  # noqa: B018 - opening each dataset reads its metadata
            except Exception:  # any failure to read it back means: redo the part
                return False
        return True

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict[str, Any]]:
        placed, extra = super().finish(results, classes)
        listing = [{"file": s.file, "first": s.first, "count": s.count} for s in placed]
        shards = []
        for position, shard in enumerate(placed):
            path = self.out / shard.file
            manifest = {
                "format": self.name,
                "format_version": FORMAT_VERSION,
                "layout_version": LAYOUT_VERSION,
                "num_samples": sum(s.count for s in placed),
                "classes": classes,
                "encoding": self.spec.encode,
                "preprocess": self.spec.to_dict(),
                "shard": position,
                "shards": listing,
                "imgpack_version": imgpack_version(),
            }
            text = json_text(manifest)
            if shutil.disk_usage(path.parent).free < SPACE_MARGIN:  # see Hdf5PartWriter._ensure_space
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            with h5py.File(path, "r+") as fh:
                # Unchanged on a resumed finish, so the file's bytes stay the same.
                if fh.attrs.get(MANIFEST_ATTR) != text:
                    fh.attrs[MANIFEST_ATTR] = text
                if fh.attrs.get("first") != shard.first:
                    fh.attrs["first"] = shard.first
            shards.append(Shard(shard.file, shard.first, shard.count, path.stat().st_size, file_sha256(path)))
        return shards, {
            **extra,
            "hdf5": {"layout_version": LAYOUT_VERSION, "compression": self._compression()},
        }

    def _compression(self) -> str:
        return self.options.get("compression") or "none"


__all__ = ["Hdf5PartWriter", "Hdf5Writer"]
