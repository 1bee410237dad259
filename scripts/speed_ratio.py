"""Speed benchmark: seconds per FedAvg round vs a plain training loop over the same samples, in one run.

    python scripts/speed_ratio.py configs/benchmarks/t1-fmnist-dir-fedavg.toml --rounds 3 [--threads 1]
        [--set backend=\"processes\" --set workers=2]

For each of ``--rounds`` rounds, alternately: (a) one engine round (sampling, downlink, every selected client's
local training through ``sgd_train``, aggregation; evaluation excluded), and (b) "the limit": one plain
``torch.optim.SGD`` loop with a single ``nn.Module`` over exactly the same clients' samples, the same batch size
and epochs (one model, no federated bookkeeping, no functional_call). Prints both times and their ratio
(engine / plain); a ratio near 1 means the federated machinery costs little beyond the arithmetic.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

from fedblend.config import load_config
from fedblend.core.backends import make_backend
from fedblend.core.engine import Simulation
from fedblend.core.sampling import sample_clients
from fedblend.experiment import build_data
from fedblend.models.zoo import build_model


def plain_loop(sim: Simulation, name: str, clients: list[int], gen: torch.Generator) -> float:
    cfg = sim.run_info.train
    model = build_model_like(sim, name)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    t0 = time.perf_counter()
    for cid in clients:
        data = sim.fed.clients[cid]
        for _ in range(cfg.epochs):
            for idx in torch.split(torch.randperm(data.num_train, generator=gen), cfg.batch_size):
                opt.zero_grad()
                F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
                opt.step()
    return time.perf_counter() - t0


def build_model_like(sim: Simulation, name: str):
    model = build_model(name, sim.fed.info)
    model.load_state_dict(sim.run_info.init_params)
    return model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    fed = build_data(cfg, args.data_dir)
    sim = Simulation.create(cfg.build_method(), fed, cfg.model, cfg.train, cfg.rounds, cfg.seed, cfg.sampling,
                            cfg.eval, backend=make_backend(cfg.backend, cfg.workers))
    sim.protocol = type(sim.protocol)(every=10**9)  # no evaluation inside the timed rounds
    sim.run_info = dataclasses.replace(sim.run_info, rounds=10**9)
    fed_t, plain_t, samples = [], [], []
    for r in range(args.rounds):
        clients = sample_clients(sim.sampling, fed.num_clients, sim.next_round, sim.tree)
        m = sim.run_round()
        fed_t.append(m["seconds"])
        plain_t.append(plain_loop(sim, cfg.model, clients, torch.Generator().manual_seed(r)))
        samples.append(sum(fed.clients[c].num_train for c in clients) * cfg.train.epochs)
    sim.close()
    out = {"config": args.config, "method": cfg.method, "backend": cfg.backend, "threads": torch.get_num_threads(),
           "rounds": args.rounds,
           "engine_seconds_per_round": sum(fed_t) / len(fed_t), "plain_seconds_per_round": sum(plain_t) / len(plain_t),
           "ratio_engine_over_plain": sum(fed_t) / sum(plain_t), "samples_per_round": sum(samples) / len(samples)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
