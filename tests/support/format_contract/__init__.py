"""The contract every format keeps: one suite, run for every registered format
(tests/readers/formats/test_format_contract.py) and for a format defined outside imgpack
(tests/readers/formats/test_out_of_tree_format.py).

Like torchvision's ``DatasetTestCase``: a test class subclasses ``FormatContract`` and gives the
``fmt`` fixture (a registered format's name); it then runs every check: the registry entry, pack,
``--force`` (local and in a bucket), ``--resume`` after a kill, verify, damage detected, index
files, per-sample fields, the remote round trip, every reading path and the readers' guarantees
(tests/support/format_contract/reading.py). What a format cannot do is declared in its ``Format`` (no
fields, no index files, no URL output) and checked as the refusal it promises, never skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.format_contract.fields import FieldsContract
from tests.support.format_contract.packing import PackingContract
from tests.support.format_contract.packs import SPLIT, spec_for
from tests.support.format_contract.reading import ReadingContract


class FormatContract(PackingContract, FieldsContract, ReadingContract):
    """Subclass it as ``Test...`` with a ``fmt`` fixture returning the format's name."""

    @pytest.fixture
    def small(self, fmt, packed) -> Path:
        """sample_data packed losslessly in three shards (cached for the session)."""
        return packed(fmt, options=SPLIT, **spec_for(fmt))
