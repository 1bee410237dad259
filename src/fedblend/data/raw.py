"""The canonical in-memory form of a dataset, shared by the archive readers and the synthetic generator."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RawDataset:
    """Arrays of a dataset in canonical form: uint8 images (N,C,H,W) or int64 token ids (N,L)."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    kind: str = "image"  # "image" or "text"
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    extra: dict = field(default_factory=dict)
    #: per-sample domain ids (a mix of source datasets, e.g. ``mnist_star``), for ``partition.kind = "domains"``
    train_domain: np.ndarray | None = None
    test_domain: np.ndarray | None = None
