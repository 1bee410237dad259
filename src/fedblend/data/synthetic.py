"""Synthetic image datasets for unit tests and speed measurements (not evidence of accuracy).

Each class c has a fixed random 8x8 prototype; a sample is its prototype plus Gaussian noise, clipped and
quantised to uint8 like a real image archive, so the whole pipeline (partition, normalisation, models) runs
unchanged in milliseconds.

Two sizes, by dataset name (:data:`SIZES`): ``synthetic`` (4 classes, 240 training images: unit tests) and
``synthetic-64k`` (10 classes, 64,000 training images: the overhead-bound speed proxy of
``configs/bench/proxy-*.toml``, where 64 clients of ~1,000 tiny images train an MLP with batches of 10, so a
round's time is set by the per-step overhead of the training loop, not by its arithmetic) and ``synthetic-1m``
(10 classes, a million training images: the cross-device scale configs ``configs/scale/synthetic-*.toml``, up to
100,000 clients of 10 images).
"""

from __future__ import annotations

import numpy as np

from fedblend.data.raw import RawDataset

#: dataset name -> :func:`make_synthetic` arguments
SIZES: dict[str, dict] = {
    "synthetic": {},
    "synthetic-64k": {"num_classes": 10, "train_per_class": 6_400, "test_per_class": 1_000},
    "synthetic-1m": {"num_classes": 10, "train_per_class": 100_000, "test_per_class": 1_000},
}


def make_synthetic(num_classes: int = 4, train_per_class: int = 60, test_per_class: int = 20,
                   image_size: int = 8, noise: float = 110.0, seed: int = 0) -> RawDataset:
    rng = np.random.default_rng(seed)
    protos = rng.uniform(0, 255, size=(num_classes, 1, image_size, image_size))

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(num_classes), per_class)
        x = protos[y] + rng.normal(0, noise, size=(len(y), 1, image_size, image_size))
        perm = rng.permutation(len(y))
        return np.clip(x, 0, 255).astype(np.uint8)[perm], y[perm].astype(np.int64)

    trx, tr_y = draw(train_per_class)
    tex, te_y = draw(test_per_class)
    return RawDataset("synthetic", trx, tr_y, tex, te_y, num_classes)
