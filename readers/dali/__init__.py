"""GPU decode through NVIDIA DALI, with a CPU fallback: ``dali_loader`` and what it is built from.

This package's own names are its face (``from readers.dali import dali_loader``, re-exported
below); every module in it is internal:

- ``_loader``: ``dali_loader`` and ``DaliLoader``, choosing the path (``dali-gpu``, ``dali-cpu``,
  ``dataloader``) and running it;
- ``_feed``: ``BatchFeed``, the batches of an epoch and the read's ``Geometry``, shared by every path;
- ``_pipeline``: the DALI graph (imported only when DALI runs);
- ``_fields``: ``fields=`` on the DALI paths: fields and geometry carried through the pipeline,
  the targets built with the batch path's code;
- ``_buckets``: ``buckets=`` on DALI's own pipeline, each batch one bucket;
- ``_fallback``: the CPU DataLoader path (no DALI): ``open_iterable`` + ``make_loader`` + normalising;
- ``_watch``: a dead py_workers process and a failing sample, said as errors while DALI runs.

Importing this package does not import DALI.
"""

from readers.dali._feed import PIXEL_ENCODINGS
from readers.dali._loader import DaliLoader, DaliUnavailableError, FallbackLoader, dali_loader, select_path

__all__ = [
    "PIXEL_ENCODINGS",
    "DaliLoader",
    "DaliUnavailableError",
    "FallbackLoader",
    "dali_loader",
    "select_path",
]
