"""``fedblend bench``: the engine's cost against a plain PyTorch loop over exactly the same work, in one run.

For each of ``rounds`` rounds, alternately and in the same process:

* **training**: one engine round (sampling, messages, every selected client's work through the configured
  backend, aggregation; no evaluation) against "the limit": one ``nn.Module`` trained with ``torch.optim.SGD``
  (same lr, momentum, weight decay, batch size and epochs) over the same selected clients' training samples,
  one client after another, with no federated bookkeeping;
* **evaluation**: the engine's evaluation of every client (evaluation messages, each client's personalized
  model and the global model where it is a different model) against one ``nn.Module`` evaluated once over the
  same clients' evaluation split with the same batch size (so a method that evaluates a personalized and a
  distinct global model per client, or blends / fine-tunes before evaluating, shows that work in the ratio).

``--backends a,b,...`` instead times the same rounds of the config under each backend, interleaved round by
round in one process (so a machine's load falls on all of them), and reports each backend's seconds per round,
its speed-up over the first, its accuracy after the last round (backends must agree within floating-point
tolerance), and how far training is from the device's limit: samples per second times the model's FLOPs per
training sample (counted by ``torch.utils.flop_counter`` on one forward and backward pass) against the device's
measured arithmetic peak (a large float32 matrix product, :func:`measured_peak_flops`).

It prints seconds per round for both, their ratio (engine / plain: near 1 means the federated machinery costs
little beyond the arithmetic; above 1 for methods whose clients do extra work, e.g. ALA), samples and clients
per second, the distance to the limit (FLOPs per training sample and the fraction of the measured peak the
engine's training reaches), and the peak memory: resident set size of this process and of worker processes (Linux ``ru_maxrss``)
and, on a GPU, the peak allocated CUDA memory.
"""

from __future__ import annotations

import dataclasses
import platform
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedblend.common.errors import ConfigError
from fedblend.config import RunConfig, check_config
from fedblend.core.engine import Simulation
from fedblend.core.sampling import sample_clients
from fedblend.experiment import build_data, create_simulation
from fedblend.models.zoo import build_model

MAX_ROUNDS = 10_000  # rounds `fedblend bench` times (each also trains the plain loop)


def _plain_model(sim: Simulation, name: str):
    model = build_model(name, sim.fed.info).to(sim.run_info.device)
    model.load_state_dict(sim.run_info.init_params)
    return model


def plain_train(sim: Simulation, name: str, clients: list[int], gen: torch.Generator) -> float:
    """Seconds of plain local SGD with one module over ``clients``' training samples (same batch sizes)."""
    cfg = sim.run_info.train
    model = _plain_model(sim, name)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    _sync(sim)
    t0 = time.perf_counter()
    for cid in clients:
        data = sim.fed.clients[cid]
        for _ in range(cfg.epochs):
            for idx in torch.split(torch.randperm(data.num_train, generator=gen), cfg.batch_size):
                opt.zero_grad()
                F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
                opt.step()
    _sync(sim)
    return time.perf_counter() - t0


@torch.no_grad()
def plain_eval(sim: Simulation, name: str) -> float:
    """Seconds to evaluate one module once over every client's evaluation split."""
    model = _plain_model(sim, name).eval()
    split, bs = sim.protocol.split, sim.protocol.batch_size
    _sync(sim)
    t0 = time.perf_counter()
    for data in sim.fed.clients:
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        for i in range(0, len(y), bs):
            out = model(x[i : i + bs])
            float(F.cross_entropy(out, y[i : i + bs], reduction="sum"))
            int((out.argmax(1) == y[i : i + bs]).sum())
    _sync(sim)
    return time.perf_counter() - t0


def _sync(sim: Simulation) -> None:
    if torch.device(sim.run_info.device).type == "cuda":
        torch.cuda.synchronize()


def peak_memory_mib(device: str) -> dict[str, float]:
    """Peak resident set size of this process and of its (finished or live) children, and CUDA peak memory."""
    out = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
           "peak_rss_children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0}
    if torch.device(device).type == "cuda":
        out["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _prepare(cfg: RunConfig, rounds: int, data_dir) -> tuple[RunConfig, Any, str]:
    """The checked config, its federated data and device, after checking ``rounds``."""
    cfg = check_config(cfg)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise ConfigError(f"bench rounds must be an integer in [1, {MAX_ROUNDS}], got {rounds!r}")
    return cfg, build_data(cfg, data_dir), cfg.resolved_device()


def _timed_sim(cfg: RunConfig, fed, device: str) -> Simulation:
    """A simulation whose rounds never evaluate on their own (evaluation is timed separately) and never end."""
    sim = create_simulation(cfg, fed, device=device)
    sim.protocol = dataclasses.replace(sim.protocol, every=10**9)
    sim.run_info = dataclasses.replace(sim.run_info, rounds=10**9)
    return sim


def bench(cfg: RunConfig, rounds: int = 3, data_dir: str | Path | None = None) -> dict[str, Any]:
    """Time ``rounds`` engine rounds of ``cfg`` against the plain loops (see module docstring)."""
    cfg, fed, device = _prepare(cfg, rounds, data_dir)
    sim = _timed_sim(cfg, fed, device)
    eng_t, plain_t, eng_e, plain_e, samples, clients = [], [], [], [], [], []
    with sim:
        for r in range(rounds):
            selected = sample_clients(sim.sampling, fed.num_clients, sim.next_round, sim.tree)
            m = sim.run_round()
            eng_t.append(m["seconds"])
            plain_t.append(plain_train(sim, cfg.model, selected, torch.Generator().manual_seed(r)))
            samples.append(sum(fed.clients[c].num_train for c in selected) * cfg.train.epochs)
            clients.append(len(selected))
            _sync(sim)
            e0 = time.perf_counter()
            sim.evaluate(sim.next_round - 1)
            _sync(sim)
            eng_e.append(time.perf_counter() - e0)
            plain_e.append(plain_eval(sim, cfg.model))
        flops = train_flops_per_sample(sim, cfg.model)
    peak = measured_peak_flops(device)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    return {
        "config": cfg.label, "method": cfg.method, "backend": cfg.backend,
        "workers": cfg.workers if cfg.backend == "processes" else None, "device": device,
        "threads": torch.get_num_threads(), "rounds": rounds,
        "train_engine_s": mean(eng_t), "train_plain_s": mean(plain_t), "train_ratio": sum(eng_t) / sum(plain_t),
        "eval_engine_s": mean(eng_e), "eval_plain_s": mean(plain_e), "eval_ratio": sum(eng_e) / sum(plain_e),
        "round_ratio": (sum(eng_t) + sum(eng_e)) / (sum(plain_t) + sum(plain_e)),
        "samples_per_s": sum(samples) / sum(eng_t), "clients_per_s": sum(clients) / sum(eng_t),
        "train_flops_per_sample": flops, "peak_flops": peak,
        "fraction_of_peak": sum(samples) / sum(eng_t) * flops / peak,
        "samples_per_round": mean(samples), **peak_memory_mib(device),
        "per_round": [{"round": r + 1, "train_engine_s": a, "train_plain_s": b, "eval_engine_s": c, "eval_plain_s": d}
                      for r, (a, b, c, d) in enumerate(zip(eng_t, plain_t, eng_e, plain_e))],
    }


def train_flops_per_sample(sim: Simulation, name: str) -> float:
    """FLOPs of one training sample (forward and backward of the cross-entropy), counted on a batch of 8."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _plain_model(sim, name)
    data = next(c for c in sim.fed.clients if c.num_train)
    x, y = data.train_x[:8], data.train_y[:8]
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / len(y)


def measured_peak_flops(device: str, size: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of a float32 ``size x size`` matrix product on ``device`` at the current thread count (best of
    ``repeats``): the arithmetic peak the speed is measured against."""
    size = size or (8192 if torch.device(device).type == "cuda" else 1024)
    a = torch.randn(size, size, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ a
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def compare_backends(cfg: RunConfig, backends: list[str], rounds: int = 3,
                     data_dir: str | Path | None = None) -> dict[str, Any]:
    """Time ``rounds`` training rounds (and one evaluation after each) of ``cfg`` under each backend, interleaved
    round by round in this process (see module docstring)."""
    if not backends or len(set(backends)) != len(backends):
        raise ConfigError(f"bench --backends must name distinct backends, got {backends!r}")
    cfg, fed, device = _prepare(cfg, rounds, data_dir)
    sims = {b: _timed_sim(dataclasses.replace(cfg, backend=b), fed, device).__enter__() for b in backends}
    times = {b: {"train": [], "eval": [], "cpu": []} for b in backends}
    acc, samples = {}, []
    try:
        for _ in range(rounds):
            for b, sim in sims.items():
                selected = sample_clients(sim.sampling, fed.num_clients, sim.next_round, sim.tree)
                if b == backends[0]:
                    samples.append(sum(fed.clients[c].num_train for c in selected) * cfg.train.epochs)
                c0 = time.process_time()
                times[b]["train"].append(sim.run_round()["seconds"])
                times[b]["cpu"].append(time.process_time() - c0)
                _sync(sim)
                e0 = time.perf_counter()
                row = sim.evaluate(sim.next_round - 1)
                _sync(sim)
                times[b]["eval"].append(time.perf_counter() - e0)
                acc[b] = (row or {}).get("acc")
        flops = train_flops_per_sample(sims[backends[0]], cfg.model)
    finally:
        for sim in sims.values():
            sim.__exit__(None, None, None)
    peak = measured_peak_flops(device)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    steady = lambda v: mean(v[1:] or v)  # noqa: E731 - rounds 2+: the first warms up (allocations, caches)
    base, base_cpu = steady(times[backends[0]]["train"]), steady(times[backends[0]]["cpu"])
    where = (torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda"
             else f"{platform.machine()} CPU, {torch.backends.cpu.get_cpu_capability()}")
    out = {"config": cfg.label, "method": cfg.method, "device": device, "device_name": where,
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "rounds": rounds, "samples_per_round": mean(samples), "train_flops_per_sample": flops,
           "peak_flops": peak, "backends": {}}
    for b in backends:
        tr, cpu = steady(times[b]["train"]), steady(times[b]["cpu"])
        sps = mean(samples) / tr
        out["backends"][b] = {"train_s_per_round": tr, "eval_s": mean(times[b]["eval"]),
                              "speedup_vs_" + backends[0]: base / tr, "accuracy": acc.get(b),
                              # CPU seconds of this process (threads and workers' not counted): on a shared
                              # machine the steadier measure of a one-thread CPU backend
                              "train_cpu_s_per_round": cpu, "cpu_speedup_vs_" + backends[0]: base_cpu / cpu,
                              "samples_per_s": sps, "fraction_of_peak": sps * flops / peak,
                              "train_s_by_round": times[b]["train"]}
    return {**out, **peak_memory_mib(device)}
