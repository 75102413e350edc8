"""GPU decode through NVIDIA DALI, with a CPU fallback: ``dali_loader`` and what it is built from.

- ``loader``: ``dali_loader`` and ``DaliLoader``, choosing the path (``dali-gpu``, ``dali-cpu``,
  ``dataloader``) and running it;
- ``feed``: ``BatchFeed``, the batches of an epoch and the read's ``Geometry``, shared by every path;
- ``pipeline``: the DALI graph (imported only when DALI runs);
- ``fields``: ``fields=`` on the DALI paths: fields and geometry carried through the pipeline,
  the targets built with the batch path's code;
- ``fallback``: the CPU DataLoader path (no DALI): ``open_iterable`` + ``make_loader`` + normalising;
- ``watch``: a dead py_workers process and a failing sample, said as errors while DALI runs.

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
