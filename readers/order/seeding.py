"""Reproducibility helpers: seed every RNG a training job touches, per process and per worker."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> int:
    """Seed Python, NumPy's global RNG and torch (CPU and CUDA); optionally force determinism.

    ``deterministic=True`` also makes cuDNN deterministic, turns off its autotuner and calls
    ``torch.use_deterministic_algorithms(True)`` (set CUBLAS_WORKSPACE_CONFIG for CUDA matmuls).
    PYTHONHASHSEED is exported for child processes; it cannot change this process's hashing.
    """
    seed = int(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    return seed


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoader: derive Python's and NumPy's seeds from torch's.

    torch already seeds each worker with base_seed + worker_id; random and NumPy are not,
    so forked workers would otherwise repeat the same "random" augmentations.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def make_generator(seed: int) -> torch.Generator:
    """A seeded ``torch.Generator`` for DataLoader(generator=...) and samplers."""
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return generator
