"""TFRecord shards ``shard-000000.tfrecord`` of ``tf.train.Example`` records, with DALI indexes.

On-disk layout (shared with writer.py beside it):
- a shard is a standard TFRecord file: per record ``uint64 length``, ``uint32 masked CRC32C of
  the length bytes``, ``length`` bytes of data, ``uint32 masked CRC32C of the data`` (all
  little-endian; mask = rotate right 15 + 0xa282ead8), what TensorFlow, DALI and the
  ``tfrecord`` package read. Records are uncompressed (the images are compressed already);
- a record's data is a ``tf.train.Example`` (see readers/formats/tfexample.py) with the feature
  names of TensorFlow's ImageNet conversion scripts: ``image/encoded`` (the stored bytes),
  ``image/format`` (``JPEG``, ``PNG``, ``BMP``, ``RAW`` or the original file's type),
  ``image/height``, ``image/width``, ``image/channels``, ``image/colorspace`` (``RGB``/``L``),
  ``image/class/label`` (int64, the index into the manifest's ``classes``; 0-based, unlike the
  1-based labels of TensorFlow's inception scripts that reserve 0 for "background"),
  ``image/filename`` (the source path). Raw images are ``height x width x channels`` uint8 bytes.
  imgpack writes ``imgpack/meta`` (int64 label, height, width, channels) first and
  ``image/encoded`` second, so its reader parses two entries per record instead of all of them
  (records without that lead are parsed by name);
- ``shard-000000.idx`` is the index DALI's ``tfrecord2idx`` writes: one line per record,
  ``<byte offset of the record> <record size including the framing>``. imgpack reads it once per
  process and reads a block of consecutive records with one ``pread``.

Every record's two CRCs are checked on every read (CRC32C runs at ~6 GB/s in hardware, far
cheaper than decoding a JPEG), so a flipped byte is an error, never a silently wrong image; raw
pixel datasets may skip the data CRC for speed with ``check_crc=False`` (see TfrecordReader).
"""

from __future__ import annotations

import os
import struct
from typing import IO, Any

import numpy as np

from readers.errors import ChecksumError, ManifestError, warn
from readers.formats.base import FormatReader
from readers.formats.part_files import open_shard_file
from readers.formats.tfrecord._example import ExampleError, decode_example, decode_feature, leading_entries
from readers.formats.tfrecord._fields import FIELDS_FEATURE
from readers.image.decode import jpeg_size
from readers.remote.readahead import Extent, open_parts
from readers.store.checksums import masked_crc
from readers.store.manifest import Manifest, Shard
from readers.store.record import Buffer, Record

LENGTH = struct.Struct("<QI")  # length, masked crc of the length
FOOTER = struct.Struct("<I")  # masked crc of the data
FRAMING = LENGTH.size + FOOTER.size
META_FEATURE = b"imgpack/meta"  # int64 [label, height, width, channels], written first
RECORD_FEATURES = frozenset(
    (b"image/encoded", b"image/class/label", b"image/height", b"image/width", b"image/channels")
)
FORMAT_NAMES = {"jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "raw": "RAW"}


def frame(payload: bytes) -> bytes:
    """One TFRecord record: framed, checksummed ``payload``."""
    length = struct.pack("<Q", len(payload))
    return length + FOOTER.pack(masked_crc(length)) + payload + FOOTER.pack(masked_crc(payload))


def shard_name(position: int) -> str:
    return f"shard-{position:06d}.tfrecord"


def index_name(shard_file: str) -> str:
    return shard_file.rpartition(".")[0] + ".idx"


def format_index(offsets: list[int], sizes: list[int]) -> str:
    return "".join(f"{o} {s}\n" for o, s in zip(offsets, sizes))


def parse_index(text: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(record offsets, record sizes) from a ``tfrecord2idx`` index."""
    try:
        table = np.array(text.split(), dtype=np.int64).reshape(-1, 2)
    except (ValueError, OverflowError) as exc:
        raise ManifestError(
            f"{where}: malformed tfrecord index ({exc}); rebuild it with `pack reindex DATASET`"
        ) from None
    offsets, sizes = table[:, 0], table[:, 1]
    if len(offsets) and offsets[0] != 0:
        raise ManifestError(
            f"{where}: first record at byte {offsets[0]}, not 0; rebuild it with `pack reindex DATASET`"
        )
    if len(offsets) and (np.any(sizes < FRAMING) or np.any(offsets[1:] != offsets[:-1] + sizes[:-1])):
        raise ManifestError(
            f"{where}: index entries do not follow each other; rebuild it with `pack reindex DATASET`"
        )
    return offsets, sizes


def scan_records(fileobj: IO[bytes], where: str) -> tuple[list[int], list[int]]:
    """Offsets and sizes of the records of a TFRecord stream (what ``tfrecord2idx`` computes)."""
    offsets, sizes = [], []
    position = 0
    while head := fileobj.read(LENGTH.size):
        if len(head) < LENGTH.size:
            raise ChecksumError(f"{where}: truncated record header at byte {position}")
        length, crc = LENGTH.unpack(head)
        if masked_crc(head[:8]) != crc:
            raise ChecksumError(
                f"{where}: record length at byte {position} fails its CRC; the file is corrupt"
            )
        fileobj.seek(length + FOOTER.size, os.SEEK_CUR)
        offsets.append(position)
        sizes.append(length + FRAMING)
        position += length + FRAMING
    return offsets, sizes


def unframe(view: memoryview, check_data: bool = True) -> memoryview:
    """The data of one framed record, after checking its CRCs (the data's if ``check_data``)."""
    if len(view) < FRAMING:
        raise ChecksumError("record shorter than its framing; the file is truncated")
    length, length_crc = LENGTH.unpack_from(view)
    if masked_crc(view[:8]) != length_crc or length != len(view) - FRAMING:
        raise ChecksumError("record length fails its CRC or disagrees with the index; corrupt file")
    data = view[LENGTH.size : LENGTH.size + length]
    (data_crc,) = FOOTER.unpack_from(view, LENGTH.size + length)
    if check_data and masked_crc(data) != data_crc:
        raise ChecksumError("record data fails its CRC32C; the file is corrupt (re-pack or copy it again)")
    return data


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_size(data: Buffer) -> tuple[int, int] | None:
    """(height, width) from a JPEG's or PNG's own header (None: not one of them, or unreadable)."""
    head = bytes(data[:24])
    if head.startswith(PNG_SIGNATURE) and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return height, width
    if head.startswith(b"\xff\xd8\xff"):
        return jpeg_size(data)
    return None


def _sized_by_image(record: Record) -> Record:
    # The height/width features are claims (a foreign or edited record may get them wrong); the
    # batch path places crops with them before decoding, so the image's own header decides.
    size = image_size(record.data) if record.encoding != "raw" else None
    if size is None or size == (record.height, record.width):
        return record
    return record._replace(height=size[0], width=size[1])


def example_record(data: memoryview, encoding: str) -> Record:
    """The Record of one ``Example``: from its two leading features when they are imgpack's
    (``imgpack/meta`` then ``image/encoded``), else by name from the whole message."""
    try:
        lead = leading_entries(data, 3)
        if len(lead) >= 2 and lead[0][0] == META_FEATURE and lead[1][0] == b"image/encoded":
            label, height, width, channels = decode_feature(lead[0][1])
            has_fields = len(lead) == 3 and lead[2][0] == FIELDS_FEATURE
            stored = decode_feature(lead[2][1])[0] if has_fields else None
            return _sized_by_image(
                Record(decode_feature(lead[1][1])[0], label, height, width, channels, encoding, stored)
            )
        features = decode_example(data, RECORD_FEATURES | {FIELDS_FEATURE})
        record = Record(
            features["image/encoded"][0],
            features["image/class/label"][0],
            features["image/height"][0],
            features["image/width"][0],
            features.get("image/channels", [3])[0],
            encoding,
            features.get(FIELDS_FEATURE.decode(), [None])[0],
        )
    except (ExampleError, KeyError, IndexError, ValueError) as exc:
        raise ManifestError(f"not an imgpack tf.train.Example ({exc!r} missing or malformed)") from None
    return _sized_by_image(record)


class _OpenShard:
    def __init__(self, fd: int, offsets: np.ndarray, sizes: np.ndarray):
        self.fd = fd
        self.offsets = offsets
        self.sizes = sizes

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class TfrecordReader(FormatReader):
    """``check_crc=False`` (``reader_options={"check_crc": False}``) skips the data CRC of each
    record (the length CRC is always checked): about 25 us per 150 KB raw image, a third of
    the raw batch path's time per image; ``verify=True`` always checks it."""

    checks_shards_on_open = True

    def __init__(
        self,
        root: str | os.PathLike,
        manifest: Manifest,
        verify: bool = False,
        check_crc: bool = True,
        **remote: Any,
    ):
        super().__init__(root, manifest, verify, **remote)
        self.check_crc = check_crc or verify

    def _open(self, position: int) -> _OpenShard:
        shard = self.manifest.shards[position]
        path, where = self.local_file(shard), self.location(shard.file)

        def load_index() -> tuple[np.ndarray, np.ndarray]:
            self.check_sha256(path, shard.sha256, where)  # once per process, under verify
            return self._load_index(shard, path)

        fd, (offsets, sizes) = open_shard_file(path, shard, False, load_index, where)
        return _OpenShard(fd, offsets, sizes)

    def _local_index_text(self, name: str) -> str:
        path = self.part_path(name)
        try:
            return path.read_text("ascii")
        except UnicodeDecodeError as exc:
            raise ManifestError(
                f"{path}: not a tfrecord index (byte {exc.start} is not ASCII); "
                f"rebuild it with `pack reindex {self.root}`"
            ) from None

    def sidecar_names(self, shard: Shard) -> list[str]:
        return [index_name(shard.file)]

    def _load_index(self, shard: Shard, local_path: str) -> tuple[np.ndarray, np.ndarray]:
        path = self.location(shard.file)
        name = index_name(shard.file)

        def checked(text: str, idx: str) -> tuple[np.ndarray, np.ndarray]:
            offsets, sizes = parse_index(text, idx)
            self._check_index(shard, offsets, sizes, idx)
            return offsets, sizes

        try:
            if self.parts is not None:  # a damaged cached copy is fetched again
                return self.parts.index(name, shard.sha256, checked)
            return checked(self._local_index_text(name), self.location(name))
        except FileNotFoundError:
            idx = self.location(name)
            warn(f"{idx}: index missing; rebuilding it from the shard (slow); write it back with "
                 f"`pack reindex {self.root}`")  # fmt: skip
            with open(local_path, "rb") as fh:
                offsets, sizes = map(np.asarray, scan_records(fh, path))
            self._check_index(shard, offsets, sizes, idx)
            return offsets, sizes

    def _check_index(self, shard: Shard, offsets: np.ndarray, sizes: np.ndarray, idx: str) -> None:
        if len(offsets) != shard.count:
            raise ManifestError(
                f"{idx}: lists {len(offsets)} records, the manifest {shard.count}; "
                f"rebuild it with `pack reindex {self.root}`"
            )
        if len(offsets) and int(offsets[-1] + sizes[-1]) > shard.bytes:
            raise ManifestError(
                f"{idx}: points past the end of {self.location(shard.file)}; "
                f"rebuild it with `pack reindex {self.root}`"
            )

    def _close_handle(self, handle: Any) -> None:
        handle.close()

    def extents(self, indices) -> list[Extent] | None:
        parts = open_parts(self, indices)
        if parts is None:
            return None
        out: list[Extent] = []
        for _, opened, local in parts:
            if opened.fd >= 0:
                out.append(Extent(opened.fd, opened.offsets[local], opened.sizes[local]))
        return out

    def read_local(self, position: int, a: int, b: int) -> list[Record]:
        shard = self.manifest.shards[position]
        opened: _OpenShard = self.handle(position)
        base = int(opened.offsets[a])
        length = int(opened.offsets[b - 1] + opened.sizes[b - 1]) - base
        data = os.pread(opened.fd, length, base)
        path = self.location(shard.file)
        if len(data) != length:
            raise ManifestError(f"{path}: shard is truncated (short read at byte {base}); copy it again")
        view = memoryview(data)
        records = []
        encoding, check = self.manifest.encoding, self.check_crc
        k = a
        try:
            for offset, size in zip(opened.offsets[a:b].tolist(), opened.sizes[a:b].tolist()):
                start = offset - base
                records.append(example_record(unframe(view[start : start + size], check), encoding))
                k += 1
        except (ChecksumError, ManifestError) as exc:
            raise type(exc)(f"{path}: record {k} (sample {shard.first + k}): {exc}") from None
        return records
