"""Helpers for tests: build a tiny simulation for any method."""

from __future__ import annotations

import torch

from fedblend.algorithms import build_method
from fedblend.core.engine import Simulation
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig


def tiny_sim(fed, method: str = "fedavg", options=None, transforms=None, rounds: int = 3, seed: int = 0,
             model: str = "mlp", join_ratio: float = 1.0, backend=None, **train):
    cfg = TrainConfig(**{"lr": 0.05, "batch_size": 16, "epochs": 1, **train})
    m = build_method(method, options, transforms)
    return Simulation.create(m, fed, model, cfg, rounds, seed, SamplingConfig(join_ratio=join_ratio), backend=backend)


def eval_message(sim, cid: int, rnd: int | None = None):
    """The evaluation message the server half of ``sim`` would send client ``cid`` now."""
    return sim.method.configure_evaluate(sim.server, cid, sim.sctx(sim.next_round if rnd is None else rnd))


def train_message(sim, cid: int, rnd: int | None = None):
    """The training message the server half of ``sim`` would send client ``cid`` now."""
    return sim.method.configure("train", sim.server, cid, sim.sctx(sim.next_round if rnd is None else rnd))


def without_timings(history: list[dict]) -> list[dict]:
    """Round metrics minus wall-clock fields (``*seconds*`` and the ``*_share`` derived from them), which differ
    between otherwise identical runs."""
    return [{k: v for k, v in m.items() if "seconds" not in k and not k.endswith("_share")} for m in history]


def same_state(a, b) -> bool:
    """Whether two states (nested dicts / lists of tensors and numbers) are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def run_client(sim, cid: int, msg, rnd: int | None = None, phase: str = "train"):
    """Client ``cid``'s half of one exchange, run in-process on ``msg`` and its stored state (not stored back)."""
    from fedblend.core.client import ClientJob

    rnd = sim.next_round if rnd is None else rnd
    return sim.client_runtime().handle(ClientJob(phase, cid, rnd, msg, sim.store.get(cid)))
