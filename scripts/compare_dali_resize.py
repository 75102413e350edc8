"""How far DALI's resize is from the CPU resampler (readers.resample), on the sample data.

    python scripts/compare_dali_resize.py

sample_data is packed once as raw pixels (lossless, 128x128 after the packer's --resize 128
--crop 128), then read by ``dali_loader(device="cpu")`` (DALI's ``fn.resize``) and by
``device="dataloader"`` (``open_iterable``: readers.resample) with the same options, so the two
differ only by resampling. Prints the mean and max absolute difference in grey levels per case.
Needs DALI installed (``imgpack[dali]``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packer.engine import pack_folder
from readers import RandomResizedCrop
from readers.dali import dali_loader
from readers.formats.packed_sample import PreprocessSpec

REPO = Path(__file__).resolve().parent.parent
CASES: dict[str, dict[str, Any]] = {
    "resize=96 crop=80 (shrink < 2x: bilinear)": dict(resize=96, crop=80),
    "resize=48 (shrink >= 2x: area)": dict(resize=48),
    "resize=(160, 160) (enlarge: bilinear)": dict(resize=(160, 160)),
    "RandomResizedCrop(64) + flip": dict(crop=RandomResizedCrop(64), flip=True),
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raw"
        spec = PreprocessSpec(resize=128, crop=128, encode="raw")
        pack_folder(REPO / "sample_data", path, "lmdb", spec, workers=2)
        for name, options in CASES.items():
            common: dict[str, Any] = dict(seed=1, num_workers=0, pad_last=False, **options)
            dali = [
                x.numpy().astype(np.int16) for x, _ in dali_loader(path, batch_size=8, device="cpu", **common)
            ]
            ours = [
                x.numpy().astype(np.int16)
                for x, _ in dali_loader(path, batch_size=8, device="dataloader", **common)
            ]
            diff = np.abs(np.concatenate(dali) - np.concatenate(ours))
            print(f"{name}: mean {diff.mean():.2f}, max {diff.max()} grey levels ({len(diff)} images)")


if __name__ == "__main__":
    main()
