"""TFRecord writer: ``tf.train.Example`` shards plus DALI ``tfrecord2idx`` indexes, rolled over like tar.

Parts write ``part-<part>-<n>.tfrecord`` (+ ``.idx``) files that ``finish`` renames, in order, to
``shard-000000.tfrecord``... (readers/formats/rolling_writer.py). The bytes depend only on the samples,
so the output is identical for any number of workers or engine. The layout is documented in
readers/formats/tfrecord.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from readers.formats.packed_sample import PackedSample
from readers.formats.rolling_writer import RollingPartWriter, RollingWriter
from readers.formats.tar.writer import image_ext
from readers.formats.tfrecord._example import encode_example
from readers.formats.tfrecord._fields import field_features
from readers.formats.tfrecord.reader import (
    FORMAT_NAMES,
    META_FEATURE,
    format_index,
    frame,
    scan_records,
    shard_name,
)
from readers.formats.writer_base import PartResult, add_label_runs
from readers.store.manifest import Shard


def example_bytes(
    sample: PackedSample, schema: dict[str, str] | None = None, classes: Sequence[str] = ()
) -> bytes:
    """The serialized ``tf.train.Example`` of one sample (ImageNet conversion feature names, the
    fields as the TF Object Detection API names them: readers/formats/tfrecord/_fields.py)."""
    image_format = FORMAT_NAMES.get(sample.encoding) or image_ext(sample).upper()
    fields = field_features(schema, sample.fields, sample.height, sample.width, classes) if schema else {}
    return encode_example(
        {
            META_FEATURE.decode(): [sample.label, sample.height, sample.width, sample.channels],
            "image/encoded": sample.data,
            **fields,
            "image/format": image_format,
            "image/height": sample.height,
            "image/width": sample.width,
            "image/channels": sample.channels,
            "image/colorspace": "L" if sample.channels == 1 else "RGB",
            "image/class/label": sample.label,
            # The source path's bytes: a name that is not UTF-8 (surrogate-escaped) is kept as it is.
            "image/filename": sample.rel.encode("utf-8", "surrogateescape"),
        }
    )


class TfrecordPartWriter(RollingPartWriter):
    suffix = ".tfrecord"

    def encode(self, sample: PackedSample) -> tuple[bytes, int]:
        record = frame(example_bytes(sample, self.fields, self.classes))
        return record, len(record)

    def index_text(self, entries: list[tuple[int, int]]) -> str:
        return format_index([offset for offset, _ in entries], [size for _, size in entries])


class TfrecordWriter(RollingWriter):
    part_writer = TfrecordPartWriter

    def shard_name(self, position: int) -> str:
        return shard_name(position)

    def finish(self, results: list[PartResult], classes: list[str]) -> tuple[list[Shard], dict]:
        runs: list[list[int]] = []
        for result in results:
            add_label_runs(runs, result.extra.get("label_runs", []), counted=True)
        return self.place_shards(results), {"index": "tfrecord2idx", **self.label_file(runs)}


def shard_index(fileobj, where: str) -> tuple[int, str]:
    """(records, index text) of one TFRecord shard, read from the shard itself (``pack reindex``)."""
    offsets, sizes = scan_records(fileobj, where)
    return len(offsets), format_index(offsets, sizes)
