"""Randomness is passed in: one seed becomes a tree of independent generators.

Every random stream of a run is derived from ``(seed, *tags)`` by hashing, e.g.
``tree.torch("client", cid, round)`` for the batches of client ``cid`` in round ``round``. Streams never
share state, so adding a diagnostic that draws random numbers cannot change training, two backends that run
clients in different orders give the same numbers, and resuming from a checkpoint needs no saved RNG state.
No library code touches the global ``torch`` / ``numpy`` seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch


def derive_seed(seed: int, *tags: object) -> int:
    """A 63-bit integer seed that depends only on ``seed`` and the tags (order matters)."""
    text = repr((int(seed),) + tuple(str(t) for t in tags)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class SeedTree:
    """A node of the seed tree; ``child`` descends, ``torch``/``numpy`` hand out fresh generators."""

    seed: int
    path: tuple[str, ...] = ()

    def child(self, *tags: object) -> SeedTree:
        return SeedTree(self.seed, self.path + tuple(str(t) for t in tags))

    def int(self, *tags: object) -> int:
        return derive_seed(self.seed, *self.path, *tags)

    def torch(self, *tags: object) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(self.int(*tags))
        return g

    def numpy(self, *tags: object) -> np.random.Generator:
        return np.random.default_rng(self.int(*tags))
