"""HDF5: one file per part (``data-000000.h5``) holding flat or (N, H, W, C) images."""

from __future__ import annotations

import re

from readers.formats.format import SHARDING_OPTIONS, Format
from readers.formats.pack_option import PackOption

COMPRESSION = PackOption(
    "compression", "choice", "HDF5 filter on the stored images.", choices=("none", "lzf", "gzip")
)

FORMAT = Format(
    name="hdf5",
    reader="readers.formats.hdf5.reader:Hdf5Reader",
    writer="readers.formats.hdf5.writer:Hdf5Writer",
    files=re.compile(r"data-\d{6}\.h5"),
    remote_finish="local",  # finish writes the manifest into every file
    pack_options=(*SHARDING_OPTIONS, COMPRESSION),  # an HDF5 filter on `images`
    stores_fields=True,  # a 'fields' dataset of JSON text, under each sample's crc32
)
