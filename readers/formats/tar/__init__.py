"""WebDataset tar shards (``shard-000000.tar`` + DALI ``.idx``), written as parts then renamed."""

from __future__ import annotations

import re

from readers.formats.format import SHARDING_OPTIONS, Format
from readers.formats.pack_option import SHARD_SIZE

FORMAT = Format(
    name="tar",
    reader="readers.formats.tar.reader:TarReader",
    writer="readers.formats.tar.writer:TarWriter",
    files=re.compile(r"(shard|part)-\d{6}(-\d{5})?\.(tar|idx)|labels\.i64"),  # labels: label_file.py
    remote_finish="rename",
    pack_options=(*SHARDING_OPTIONS, SHARD_SIZE),  # roll over to a new file at this size
    indexer="readers.formats.tar.writer:shard_index",
    stores_fields=True,  # every field in <key>.json, the caption also as <key>.txt
)
