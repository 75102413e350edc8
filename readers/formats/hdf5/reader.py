"""HDF5 datasets: one or more files ``data-000000.h5`` readable with plain h5py.

On-disk layout of one file (shared with writer.py beside it; docs/formats.md's
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

import os
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from readers.errors import ChecksumError, ManifestError
from readers.formats.base import FormatReader
from readers.remote.readahead import Extent, open_parts, spans
from readers.store.record import Record, record_crc

LAYOUT_VERSION = 1
MANIFEST_ATTR = "imgpack_manifest"
# Per open file and process (so memory is this times the shard files a worker touches). Raw
# images are one chunk each and read whole; the cache matters for the flat layout, whose 1 MiB
# chunks hold several neighbouring images: a few chunks let a sequential reader decompress and
# read each chunk once even when a block ends inside it.
CHUNK_CACHE_BYTES = 4 << 20
CHUNK_CACHE_SLOTS = 10007  # a prime, well above the number of chunks the cache can hold
FLAT_CHUNK_BYTES = 1 << 20
MAX_PIXELS = 89_478_485  # the packer's default max_pixels (Pillow's bomb limit)


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


def _expect(path: str, name: str, dataset: Any, dtype_kind: str, shape: tuple) -> None:
    """Refuse an HDF5 dataset whose dtype kind ("u", "i") or shape (None: any) is not the layout's."""
    ok_dtype = dataset.dtype.kind in dtype_kind and (name != "images" or dataset.dtype == np.uint8)
    got = dataset.shape
    ok_shape = len(got) == len(shape) and all(w is None or w == g for w, g in zip(shape, got))
    if not (ok_dtype and ok_shape):
        want = "x".join("*" if w is None else str(w) for w in shape)
        raise ManifestError(
            f"{path}: HDF5 dataset {name!r} is {dataset.dtype} {dataset.shape}, the layout needs "
            f"{'uint8' if name == 'images' else dtype_kind + ' integers'} of shape ({want}); "
            "re-pack the dataset"
        )


def open_images(file: h5py.File) -> h5py.Dataset:
    """``images`` without a chunk cache when it has no filter: a block is then read straight from
    the file. With the cache every block read brought in its whole 1 MiB chunk, and a shuffled
    read of 54 KB blocks grew a process by ~80 MB per 500 blocks and read slower
    (docs/many-ranks.md). A compressed dataset keeps the cache, so a chunk is inflated once, not
    per block. Opened before anything else opens it: HDF5 shares one cache per open dataset."""
    access = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    access.set_chunk_cache(0, 0, 1.0)  # slots, bytes, preemption
    try:
        dataset = h5py.h5d.open(file.id, b"images", dapl=access)
    except KeyError:
        return file["images"]  # names the missing dataset as the layout check expects
    if dataset.get_create_plist().get_nfilters() == 0:
        return h5py.Dataset(dataset)
    dataset.close()
    return file["images"]


class Hdf5Part:
    """One open file and the small per-sample arrays, read once per process, checked against the layout."""

    def __init__(self, path: str, expected: int, encoding: str, **kwargs: Any):
        self.path = path
        self.file = open_h5(path, **kwargs)
        try:
            self._load(expected, encoding)
        except BaseException:
            self.file.close()
            raise

    def _load(self, n: int, encoding: str) -> None:
        path = self.path
        try:
            held = self.file["labels"].shape
            if held[:1] != (n,):
                count = held[0] if held else 0
                raise ManifestError(
                    f"{path}: holds {count} samples, the manifest says {n}; re-pack the dataset"
                )
            self.images = open_images(self.file)
            self.flat = self.images.ndim == 1
            if self.flat != (encoding != "raw"):
                layout = "a flat byte array" if self.flat else "an image array"
                raise ManifestError(f"{path}: 'images' is {layout} but the manifest says encoding {encoding}")
            if self.flat:
                _expect(path, "images", self.images, "u", (None,))
                _expect(path, "offsets", self.file["offsets"], "iu", (n + 1,))
                _expect(path, "shapes", self.file["shapes"], "iu", (n, 3))
                # no copy if int64
                self.offsets: np.ndarray | None = np.asarray(self.file["offsets"][:], dtype=np.int64)
                self.shapes = self.file["shapes"][:]
                steps = np.diff(self.offsets)
                if self.offsets[0] != 0 or (steps < 0).any() or self.offsets[-1] > self.images.shape[0]:
                    raise ManifestError(f"{path}: 'offsets' do not index the 'images' bytes; re-pack")
                if (self.shapes < 0).any():
                    raise ManifestError(f"{path}: 'shapes' holds a negative size; re-pack the dataset")
            else:
                _expect(path, "images", self.images, "u", (n, None, None, None))
                if self.images.shape[3] not in (1, 3):
                    raise ManifestError(f"{path}: 'images' has {self.images.shape[3]} channels; re-pack")
                self.offsets = self.shapes = None
            _expect(path, "labels", self.file["labels"], "iu", (n,))
            _expect(path, "crc32", self.file["crc32"], "u", (n,))
            self.labels = np.asarray(self.file["labels"][:], dtype=np.int64)
            self.crc = self.file["crc32"][:]
            # per-sample fields (canonical JSON text), in datasets packed with fields
            self.fields = self.file["fields"] if "fields" in self.file else None
        except KeyError as exc:
            raise ManifestError(f"{path}: missing HDF5 dataset {exc}; re-pack the dataset") from None

    def close(self) -> None:
        self.file.close()

    def image_extents(self, local: np.ndarray) -> list[Extent]:
        """Where in the file the ``images`` bytes of local samples ``local`` lie: their chunks
        (from HDF5's chunk index, read once), or the byte range of an unchunked dataset."""
        table = self.__dict__.get("_chunks")
        if table is None:
            table = self._chunks = chunk_table(self.images)
        fd = self.file.id.get_vfd_handle()
        if not isinstance(fd, int):
            return []
        base, step, offsets, sizes = table
        if self.flat:
            assert self.offsets is not None
            starts, ends = self.offsets[local], np.maximum(self.offsets[local + 1], self.offsets[local] + 1)
        else:
            size = int(np.prod(self.images.shape[1:]))
            starts, ends = local * size, (local + 1) * size
        if step == 0:  # contiguous: one range of the file
            return [Extent(fd, base + starts, ends - starts)]
        if self.flat:  # a chunk holds `step` bytes
            chunks = spans(starts // step, (ends - 1) // step)
        else:  # a chunk holds `step` images
            chunks = local // step
        chunks = chunks[sizes[chunks] > 0]
        return [Extent(fd, offsets[chunks], sizes[chunks])]


def chunk_table(images: Any) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(file offset of an unchunked dataset, samples per chunk along the first axis (0: not
    chunked), each chunk's file offset, its stored size) of ``images``."""
    dsid = images.id
    if images.chunks is None:
        return int(dsid.get_offset() or 0), 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
    step = images.chunks[0]
    count = -(-images.shape[0] // step)
    offsets, sizes = np.zeros(count, np.int64), np.zeros(count, np.int64)  # size 0: never written
    for i in range(dsid.get_num_chunks()):
        info = dsid.get_chunk_info(i)
        k = info.chunk_offset[0] // step
        if 0 <= k < count:
            offsets[k], sizes[k] = info.byte_offset, info.size
    return 0, step, offsets, sizes


class Hdf5Reader(FormatReader):
    oldest_format_version = 2  # the crc32 dataset covers labels and shapes since format_version 2

    def _part(self, shard: int, **kwargs: Any) -> Hdf5Part:
        entry = self.manifest.shards[shard]
        path, where = self.local_file(entry), self.location(entry.file)
        if os.path.isfile(path):
            self.check_sha256(path, entry.sha256, where)
        part = Hdf5Part(path, entry.count, self.manifest.encoding, **kwargs)
        try:
            self.check_labels(part.labels, f"{where}: 'labels'")
            if part.shapes is not None:
                self._check_shapes(part.shapes, where)
        except BaseException:
            part.close()
            raise
        return part

    def _check_shapes(self, shapes: np.ndarray, where: str) -> None:
        """Every ``shapes`` row within what the manifest says was stored, so a corrupt row is
        named here rather than sizing a batch buffer (100000 x 100000 px) later."""
        stored = self.manifest.stored_sizes
        if stored:
            high_h, high_w = stored["max_height"], stored["max_width"]
            bad = (shapes[:, 0] > high_h) | (shapes[:, 1] > high_w)
            limit = f"the largest stored image ({high_h}x{high_w}, the manifest's stored_sizes)"
        else:  # packed before stored_sizes was recorded: the packer's pixel bound
            pixels = int(self.manifest.preprocess.get("max_pixels") or MAX_PIXELS)
            bad = shapes[:, 0].astype(np.int64) * shapes[:, 1] > pixels
            limit = f"the packer's max_pixels ({pixels})"
        bad |= ~np.isin(shapes[:, 2], (1, 3)) | (shapes[:, 0] < 1) | (shapes[:, 1] < 1)
        if bad.any():
            k = int(np.argmax(bad))
            h, w, c = shapes[k].tolist()
            raise ManifestError(
                f"{where}: 'shapes' row {k} is {h}x{w}x{c}, beyond {limit} or not 1 or 3 channels; "
                "the file is corrupt, re-pack the dataset"
            )

    def check_parts(self) -> None:
        self.check_parts_of(range(len(self.manifest.shards)))

    def check_parts_of(self, positions: Sequence[int]) -> None:
        for shard in positions:  # under verify each is hashed first: a view's parent checks its own
            self._part(shard).close()

    def _open(self, shard: int) -> Hdf5Part:
        return self._part(
            shard,
            rdcc_nbytes=CHUNK_CACHE_BYTES,
            rdcc_nslots=CHUNK_CACHE_SLOTS,
            rdcc_w0=1.0,  # sequential reads: drop fully read chunks first
        )

    def extents(self, indices) -> list[Extent] | None:
        parts = open_parts(self, indices)
        return None if parts is None else [e for _, part, local in parts for e in part.image_extents(local)]

    def read_local(self, shard: int, a: int, b: int) -> list[Record]:
        part = self.handle(shard)
        first = self.manifest.shards[shard].first
        return self._flat(part, a, b, first) if part.flat else self._array(part, a, b, first)

    def _flat(self, part: Hdf5Part, a: int, b: int, first: int) -> list[Record]:
        assert part.offsets is not None and part.shapes is not None  # a flat part has both
        offsets = part.offsets[a : b + 1]
        base = int(offsets[0])
        data = memoryview(part.images[base : int(offsets[-1])])  # one read for the whole block
        ends = (offsets - base).tolist()
        encoding = self.manifest.encoding
        records = []
        stored = self._stored_fields(part, a, b)
        for k, (height, width, channels) in enumerate(part.shapes[a:b].tolist()):
            view = data[ends[k] : ends[k + 1]]
            record = Record(view, int(part.labels[a + k]), height, width, channels, encoding, stored[k])
            self._check(part, a + k, first, record)
            records.append(record)
        return records

    def _array(self, part: Hdf5Part, a: int, b: int, first: int) -> list[Record]:
        _, height, width, channels = part.images.shape
        size = height * width * channels
        flat = memoryview(part.images[a:b].reshape(-1))  # one slice of the 4-D dataset
        records = []
        stored = self._stored_fields(part, a, b)
        for k in range(b - a):
            view = flat[k * size : (k + 1) * size]
            record = Record(view, int(part.labels[a + k]), height, width, channels, "raw", stored[k])
            self._check(part, a + k, first, record)
            records.append(record)
        return records

    def _stored_fields(self, part: Hdf5Part, a: int, b: int) -> list[bytes | None]:
        """The stored fields (JSON bytes) of samples [a, b), one read; None where there are none."""
        if part.fields is None or not self.manifest.fields:
            return [None] * (b - a)
        return [bytes(v) for v in part.fields[a:b]]

    def _check(self, part: Hdf5Part, k: int, first: int, record: Record) -> None:
        if self.verify and record_crc(*record) != int(part.crc[k]):
            raise ChecksumError(
                f"{self.describe(first + k)}: label, shape or image bytes do not match their checksum; "
                "the file is corrupt"
            )

    def labels(self) -> np.ndarray:
        parts = []
        for shard, entry in enumerate(self.manifest.shards):
            part = self._handles.get(shard) if self._pid == os.getpid() else None
            if part is not None:  # the file this reader's samples come from
                parts.append(part.labels)
                continue
            # A short-lived handle: a file opened here and inherited by forked workers is avoided.
            with open_h5(self.local_file(entry)) as fh:
                self.check_not_replaced()  # the path may name a new dataset's file now
                parts.append(fh["labels"][:])
        labels = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        self.check_labels(labels, f"{self.root}: 'labels'")
        return labels
