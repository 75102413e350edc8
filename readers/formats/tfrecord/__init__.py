"""TFRecord shards of ``tf.train.Example`` (``shard-000000.tfrecord`` + DALI ``.idx``).

The ``Format`` below names the reader and writer modules; internal: ``_example``
(``tf.train.Example`` encoded and parsed by hand), ``_fields`` (fields as Example features).
"""

from __future__ import annotations

import re

from readers.formats.format import SHARDING_OPTIONS, Format
from readers.formats.pack_option import SHARD_SIZE

FORMAT = Format(
    name="tfrecord",
    reader="readers.formats.tfrecord.reader:TfrecordReader",
    writer="readers.formats.tfrecord.writer:TfrecordWriter",
    files=re.compile(r"(shard|part)-\d{6}(-\d{5})?\.(tfrecord|idx)|labels\.i64"),  # labels: label_file.py
    remote_finish="rename",
    pack_options=(*SHARDING_OPTIONS, SHARD_SIZE),  # roll over to a new file at this size
    reader_options=("check_crc",),
    indexer="readers.formats.tfrecord.writer:shard_index",
    stores_fields=True,  # tf.train.Example features (image/object/bbox/*, ...) + imgpack/fields
)
