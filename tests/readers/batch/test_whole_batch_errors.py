"""A DataLoader that batches imgpack's whole batches again is one clear error naming batch_size=None,
in the main process and from worker processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from readers import ImgpackError, open_iterable
from tests.support.damage import SMALL, SPLIT

# -- a DataLoader that batches whole batches again: one clear line from the workers too -------
DOUBLE_BATCH = """
import sys
from torch.utils.data import DataLoader
from readers import open_iterable
it = open_iterable(sys.argv[1], batch_size=8, crop=32, shuffle=True, seed=0)
for batch in DataLoader(it, batch_size=64, num_workers=2, persistent_workers=True):
    pass
"""


def test_double_batching_in_workers_is_one_clear_line(packed):
    from tests.conftest import cli_env

    root = packed("tar", options=SPLIT, **SMALL)
    proc = subprocess.run(
        [sys.executable, "-c", DOUBLE_BATCH, str(root)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "readers.batch._whole_batch.WholeBatchCollatedError: open_iterable(batch_size=B) already"
    ), last
    assert "DataLoader(dataset, batch_size=None, ...)" in last and "in DataLoader worker process" in last
    assert "Original Traceback" not in proc.stderr and "Caught WholeBatchCollatedError" not in proc.stderr


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("loader_batch_size", [1, 32])
def test_batching_whole_batches_again_is_an_error_naming_batch_size_none(packed, workers, loader_batch_size):
    path = packed("lmdb", resize=40, crop=32, encode="raw")
    it = open_iterable(path, batch_size=8)
    with pytest.raises(ImgpackError) as caught:
        next(iter(DataLoader(it, batch_size=loader_batch_size, num_workers=workers)))
    assert "DataLoader(dataset, batch_size=None" in str(caught.value) and "make_loader" in str(caught.value)
    images, labels = next(iter(DataLoader(it, batch_size=None, num_workers=workers)))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)
