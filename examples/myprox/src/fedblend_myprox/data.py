"""A dataset plug-in: Gaussian blobs drawn as tiny 1x6x6 images (no files; a stand-in for a loader that reads
your own archives from ``data_dir``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedblend.data.raw import RawDataset


def blobs(data_dir: Path, download: bool = True) -> RawDataset:
    """3 classes of 6x6 uint8 images, 200 training and 60 test samples per class."""
    rng = np.random.default_rng(7)
    centres = rng.uniform(40, 215, size=(3, 1, 6, 6))

    def draw(per_class: int):
        y = np.repeat(np.arange(3), per_class)
        x = np.clip(centres[y] + rng.normal(0, 150, size=(len(y), 1, 6, 6)), 0, 255).astype(np.uint8)
        perm = rng.permutation(len(y))
        return x[perm], y[perm].astype(np.int64)

    (trx, try_), (tex, tey) = draw(200), draw(60)
    return RawDataset("blobs", trx, try_, tex, tey, num_classes=3)


# what the samples are, so a config is checked against the model before any data is loaded
blobs.inputs = ("image", (1, 6))
