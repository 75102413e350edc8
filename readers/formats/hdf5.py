"""HDF5 datasets: one or more files ``data-000000.h5`` readable with plain h5py.

On-disk layout of one file (shared with the writer in packer/formats/hdf5.py; the README's
"HDF5 layout" section documents it for people reading the files without imgpack). N is the
number of samples in this file; sample k of the file is global sample ``attrs["first"] + k``.

- encoded images (``encoding`` jpeg, png, bmp or original):
  ``images``  uint8 (total bytes,)  every image's bytes back to back, chunked;
  ``offsets`` int64 (N + 1,)        image k is ``images[offsets[k]:offsets[k + 1]]``;
  ``shapes``  int32 (N, 3)          height, width, channels of each (decoded) image;
- raw pixels (``encoding`` raw):
  ``images``  uint8 (N, H, W, C)    one image per chunk, optionally lzf/gzip compressed;
- always:
  ``labels``  int64 (N,)            class index into the manifest's ``classes``;
  ``keys``    vlen UTF-8 str (N,)   the source file's path relative to the source folder;
  ``crc32``   uint32 (N,)           zlib.crc32 of each image's stored bytes;
- attributes: ``encoding``, ``layout`` ("flat" or "array"), ``count`` (N), ``first``, and
  ``imgpack_manifest``: the dataset manifest as a JSON string (classes, preprocess, shards).
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import h5py
import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.formats.base import FormatReader
from readers.record import Record

LAYOUT_VERSION = 1
MANIFEST_ATTR = "imgpack_manifest"
# Per open file and process (so memory is this times the shard files a worker touches). Raw
# images are one chunk each and read whole; the cache matters for the flat layout, whose 1 MiB
# chunks hold several neighbouring images: a few chunks let a sequential reader decompress and
# read each chunk once even when a block ends inside it.
CHUNK_CACHE_BYTES = 4 << 20
CHUNK_CACHE_SLOTS = 10007  # a prime, well above the number of chunks the cache can hold
FLAT_CHUNK_BYTES = 1 << 20


def shard_name(position: int) -> str:
    return f"data-{position:06d}.h5"


def open_h5(path: str | os.PathLike, **kwargs: Any) -> h5py.File:
    """Open read-only; retry without file locks where the filesystem (NFS, say) refuses them.

    The library default is tried first: HDF5 refuses a second open in the same process whose
    locking flag differs from the first (e.g. a user's own ``h5py.File`` of the same file).
    """
    try:
        try:
            return h5py.File(path, "r", **kwargs)
        except OSError as exc:
            if "lock" not in str(exc).lower():
                raise
            return h5py.File(path, "r", locking=False, **kwargs)
    except FileNotFoundError:
        raise ManifestError(f"{path}: HDF5 file listed in the manifest is missing; re-pack") from None
    except OSError as exc:
        raise ManifestError(f"{path}: not a readable HDF5 file ({exc}); re-pack the dataset") from None


class Hdf5Part:
    """One open file and the small per-sample arrays, read once per process."""

    def __init__(self, path: str, expected: int):
        self.file = open_h5(
            path,
            rdcc_nbytes=CHUNK_CACHE_BYTES,
            rdcc_nslots=CHUNK_CACHE_SLOTS,
            rdcc_w0=1.0,  # sequential reads: drop fully read chunks first
        )
        try:
            self.images = self.file["images"]
            self.flat = self.images.ndim == 1
            self.offsets = self.file["offsets"][:] if self.flat else None
            self.shapes = self.file["shapes"][:] if self.flat else None
            self.labels = self.file["labels"][:]
            self.crc = self.file["crc32"][:]
        except KeyError as exc:
            self.file.close()
            raise ManifestError(f"{path}: missing HDF5 dataset {exc}; re-pack the dataset") from None
        if len(self.labels) != expected or (self.flat and len(self.offsets) != expected + 1):
            self.file.close()
            raise ManifestError(
                f"{path}: holds {len(self.labels)} samples, the manifest says {expected}; re-pack the dataset"
            )
        self.path = path

    def close(self) -> None:
        self.file.close()


class Hdf5Reader(FormatReader):
    name = "hdf5"

    def _open(self, shard: int) -> Hdf5Part:
        entry = self.manifest.shards[shard]
        return Hdf5Part(os.fspath(self.root / entry.file), entry.count)

    def read_local(self, shard: int, a: int, b: int) -> list[Record]:
        part = self.handle(shard)
        return self._flat(part, a, b) if part.flat else self._array(part, a, b)

    def _flat(self, part: Hdf5Part, a: int, b: int) -> list[Record]:
        offsets = part.offsets[a : b + 1]
        base = int(offsets[0])
        data = memoryview(part.images[base : int(offsets[-1])])  # one read for the whole block
        ends = (offsets - base).tolist()
        encoding = self.manifest.encoding
        records = []
        for k, (height, width, channels) in enumerate(part.shapes[a:b].tolist()):
            view = data[ends[k] : ends[k + 1]]
            self._check(part, a + k, view)
            records.append(Record(view, int(part.labels[a + k]), height, width, channels, encoding))
        return records

    def _array(self, part: Hdf5Part, a: int, b: int) -> list[Record]:
        _, height, width, channels = part.images.shape
        size = height * width * channels
        flat = memoryview(part.images[a:b].reshape(-1))  # one slice of the 4-D dataset
        records = []
        for k in range(b - a):
            view = flat[k * size : (k + 1) * size]
            self._check(part, a + k, view)
            records.append(Record(view, int(part.labels[a + k]), height, width, channels, "raw"))
        return records

    def _check(self, part: Hdf5Part, k: int, view: memoryview) -> None:
        if self.verify and zlib.crc32(view) & 0xFFFFFFFF != int(part.crc[k]):
            raise ChecksumError(
                f"{part.path}: sample {k} of this file does not match its checksum; the file is corrupt"
            )

    def labels(self) -> np.ndarray:
        # A short-lived handle: a file opened here and inherited by forked workers is avoided.
        parts = []
        for entry in self.manifest.shards:
            with open_h5(self.root / entry.file) as fh:
                parts.append(fh["labels"][:])
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def read_file_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest stored in an imgpack HDF5 file's attributes."""
    with open_h5(path) as fh:
        return json.loads(fh.attrs[MANIFEST_ATTR])
