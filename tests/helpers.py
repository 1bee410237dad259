"""Helpers for tests: build a tiny simulation for any method."""

from __future__ import annotations

from fedblend.algorithms import build_method
from fedblend.core.engine import Simulation
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig


def tiny_sim(fed, method: str = "fedavg", options=None, transforms=None, rounds: int = 3, seed: int = 0,
             model: str = "mlp", join_ratio: float = 1.0, **train):
    cfg = TrainConfig(**{"lr": 0.05, "batch_size": 16, "epochs": 1, **train})
    m = build_method(method, options, transforms)
    return Simulation.create(m, fed, model, cfg, rounds, seed, SamplingConfig(join_ratio=join_ratio))


def without_timings(history: list[dict]) -> list[dict]:
    """Round metrics minus wall-clock fields (``*seconds*`` and the ``*_share`` derived from them), which differ
    between otherwise identical runs."""
    return [{k: v for k, v in m.items() if "seconds" not in k and not k.endswith("_share")} for m in history]
