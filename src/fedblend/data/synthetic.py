"""A tiny synthetic image dataset for unit tests (not evidence of accuracy).

Each class c has a fixed random 8x8 prototype; a sample is its prototype plus Gaussian noise, clipped and
quantised to uint8 like a real image archive, so the whole pipeline (partition, normalisation, models) runs
unchanged in milliseconds.
"""

from __future__ import annotations

import numpy as np

from fedblend.data.raw import RawDataset


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
