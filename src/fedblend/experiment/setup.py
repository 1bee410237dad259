"""What a run builds before its first round: the federated data of a config, and its simulation (method, model,
backend with its worker count, device), with a model too large for memory as a config error."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fedblend.common.errors import ConfigError
from fedblend.config import RunConfig
from fedblend.core.backends import make_backend
from fedblend.core.engine import Simulation
from fedblend.data.federated import FederatedData, build_federated
from fedblend.data.sources import load_dataset


def build_data(cfg: RunConfig, data_dir: str | Path | None = None) -> FederatedData:
    raw = load_dataset(cfg.dataset, data_dir)
    return build_federated(raw, cfg.partition, cfg.seed)


def create_simulation(cfg: RunConfig, fed: FederatedData, device: str | None = None,
                      rounds: int | None = None, backend: Any = None, method: Any = None) -> Simulation:
    """The simulation of run config ``cfg`` on ``fed`` (method, model, training, sampling, evaluation, backend,
    device, non-finite policy), for ``rounds`` rounds (default the config's); ``backend`` replaces the config's
    (e.g. the Flower backend of :mod:`fedblend.flower`), ``method`` the method built from ``cfg`` (it must be
    that method: :class:`fedblend.flower.strategy.MethodStrategy` passes it with its server half routed through a
    Flower ``Strategy``)."""
    if backend is None:
        check_backend(cfg)
        backend = make_backend(cfg.backend, worker_count(cfg, fed.num_clients))
    try:
        return Simulation.create(method or cfg.build_method(), fed, cfg.model, cfg.train, rounds or cfg.rounds, cfg.seed,
                                 cfg.sampling, cfg.eval, backend=backend, device=device or cfg.resolved_device(),
                                 on_nonfinite=cfg.on_nonfinite, on_divergence=cfg.on_divergence,
                                 divergence_factor=cfg.divergence_factor, init=cfg.init)
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        raise ConfigError(f"{cfg.label}: the model and the method's state do not fit in memory "
                          f"({_first_line(exc)}); lower the sizes in [options] or the model") from None


def check_backend(cfg: RunConfig, backend: Any = None) -> None:
    """``backend = "flower-sim"`` runs the engine inside Flower's Simulation Engine, which drives it
    (:mod:`fedblend.flower.sim`, a layer above this one): only ``fedblend run`` (or that module) starts it."""
    if backend is None and cfg.backend == "flower-sim":
        raise ConfigError("backend 'flower-sim' runs on Flower's Simulation Engine: start it with `fedblend run "
                          "... --backend flower-sim` or fedblend.flower.sim.simulate(cfg, out) (here: use "
                          "backend = 'sequential', the same results)")


def worker_count(cfg: RunConfig, num_clients: int) -> int:
    """``cfg.workers`` capped at the number of clients and of CPU cores (a warning says so): more worker
    processes would hold no client, or only compete for the cores, each with its own copy of the model."""
    from fedblend.common.cores import usable_cores

    cores = usable_cores()
    cap = max(1, min(num_clients, cores))
    if cfg.backend == "processes" and cfg.workers > cap:
        warnings.warn(f"workers = {cfg.workers} capped to {cap} (the run has {num_clients} clients and this process "
                      f"{cores} usable CPU cores)", RuntimeWarning, stacklevel=3)
    return min(cfg.workers, cap)


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.split("DefaultCPUAllocator: ")[-1][:200] or type(exc).__name__
