"""Client sampling per round.

* ``fixed``: ``max(1, round(join_ratio * N))`` clients uniformly without replacement (FedAvg, PFLlib).
* ``uniform_range``: the number of clients is uniform in ``[ceil(low * N), N]`` then that many are drawn
  (FedAPA: at least 60% of clients join each round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.common.errors import ConfigError
from fedblend.common.rng import SeedTree

SCHEMES = ("fixed", "uniform_range")


@dataclass(frozen=True)
class SamplingConfig:
    """Which clients join each round (the ``[sampling]`` table of a run config)."""

    CHOICES: ClassVar[dict] = {"scheme": SCHEMES}
    RANGES: ClassVar[dict] = {"join_ratio": "(0, 1]", "low": "(0, 1]", "high": "(0, 1]"}
    #: ``fixed``: round(join_ratio x N) clients; ``uniform_range``: count uniform in [ceil(low N), floor(high N)]
    scheme: str = "fixed"
    #: scheme ``fixed``: the share of the clients that join each round
    join_ratio: float = 1.0
    #: uniform_range: lower share (FedAPA: at least 60% join); ``low <= high``
    low: float = 0.6
    #: uniform_range: upper share
    high: float = 1.0

    def validate(self, where: str) -> None:
        """The cross-field rule of ``[sampling]``: ``low <= high``."""
        if self.low > self.high:
            raise ConfigError(f"{where}.low must be <= {where}.high, got low = {self.low}, high = {self.high}")


def sample_clients(cfg: SamplingConfig, num_clients: int, rnd: int, tree: SeedTree) -> list[int]:
    """Sorted ids of the clients joining round ``rnd``; depends only on the seed and the round."""
    g = tree.torch("sampling", rnd)
    if cfg.scheme == "fixed":
        k = max(1, int(round(cfg.join_ratio * num_clients)))
    elif cfg.scheme == "uniform_range":
        lo = max(1, math.ceil(cfg.low * num_clients))
        hi = max(lo, math.floor(cfg.high * num_clients))
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
    else:
        raise ValueError(f"sampling.scheme must be one of {list(SCHEMES)}, got {cfg.scheme!r}")
    if k >= num_clients:
        return list(range(num_clients))
    return sorted(torch.randperm(num_clients, generator=g)[:k].tolist())
