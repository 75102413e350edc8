"""LMDB: one environment per part (``data-000000.lmdb/``), fixed-width index keys.

The ``Format`` below names the reader and writer modules; internal: ``_pages`` (where each record
lies in ``data.mdb``, for read-ahead).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from readers.formats.format import Format

ENVIRONMENT = re.compile(r"data-\d{6}\.lmdb")
ENVIRONMENT_FILES = {"data.mdb", "lock.mdb"}


def _environment(name: str, below: Sequence[str]) -> bool:
    return bool(ENVIRONMENT.fullmatch(name)) and set(below) <= ENVIRONMENT_FILES


FORMAT = Format(
    name="lmdb",
    reader="readers.formats.lmdb.reader:LmdbReader",
    writer="readers.formats.lmdb.writer:LmdbWriter",
    files=re.compile(r"(?!)"),  # everything lives in the environment folders
    folder=_environment,
    remote_finish="as-is",
    stores_fields=True,  # a JSON tail inside each value, under its CRC32 (readers/store/record.py)
)
