"""``fedblend run --dry-run`` / ``--check``: everything a run checks and builds before its first round, nothing
written, and an estimate of its time from one client's work."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fedblend.config import RunConfig, check_config, check_model_fits, config_hash
from fedblend.core.backends import make_backend
from fedblend.data.federated import build_federated
from fedblend.data.sources import load_dataset
from fedblend.experiment.setup import create_simulation
from fedblend.tracking import check_available


def dry_run(cfg: RunConfig, data_dir: str | Path | None = None, time_client: bool = True) -> dict[str, Any]:
    """Everything a run checks and builds before its first round, and nothing written: the config, the model
    against the dataset, the data and the partition drawn, the method's server half; then the parameter
    count, the bytes of one round (the first phase's messages to the clients of round 1, and, with
    ``time_client``, one client's reply) and an estimate of the run's time from one client's local training
    (scaled by training samples to the expected clients per round) plus the evaluations from the same client's
    evaluation after that training (scaled by test samples to the clients evaluated, times the rounds that
    evaluate: every ``eval.every`` and the last, twice where ``eval.select = "val"``)."""
    from fedblend.core.client import EVALUATE, ClientJob
    from fedblend.core.sampling import sample_clients

    cfg = check_config(cfg)
    check_model_fits(cfg.model, cfg.dataset)
    check_available(cfg.log)
    fed = build_federated(load_dataset(cfg.dataset, data_dir), cfg.partition, cfg.seed)
    # flower-sim's clients run the sequential backend's code in Ray actors: estimate with that
    sim = create_simulation(cfg, fed, backend=make_backend("sequential") if cfg.backend == "flower-sim" else None)
    params = sum(int(v.numel()) for v in sim.run_info.init_params.values())
    sctx = sim.sctx(0)
    phase = sim.method.phases(sctx)[0]
    selected = sample_clients(cfg.sampling, fed.num_clients, 0, sim.tree)
    per_round = [len(sample_clients(cfg.sampling, fed.num_clients, t, sim.tree)) for t in range(min(cfg.rounds, 20))]
    expected = sum(per_round) / len(per_round)
    msgs = {cid: sim.method.configure(phase, sim.server, cid, sctx) for cid in selected}
    down = sum(m.num_bytes for m in msgs.values())
    out: dict[str, Any] = {"label": cfg.label, "config_hash": config_hash(cfg.resolved()),
                           "num_clients": fed.num_clients, "train_samples": int(fed.counts["train"].sum()),
                           "test_samples": int(fed.counts["test"].sum()), "parameters": params,
                           "parameter_bytes": sum(int(v.numel()) * v.element_size()
                                                  for v in sim.run_info.init_params.values()),
                           "clients_round1": len(selected), "clients_per_round_expected": expected,
                           "bytes_down_round1": down}
    if time_client and selected:
        cid = selected[0]
        with sim:
            t0 = time.perf_counter()
            res = sim._run_jobs([ClientJob(phase, cid, 0, msgs[cid], None)])[0]
            secs = time.perf_counter() - t0
            emsg = sim.method.configure_evaluate(sim.server, cid, sctx)
            emsg.config.update({"split": sim.protocol.split, "batch_size": sim.protocol.batch_size})
            t0 = time.perf_counter()
            sim._run_jobs([ClientJob(EVALUATE, cid, 0, emsg, res.state)])
            eval_secs = time.perf_counter() - t0
        mean_train = sum(fed.clients[c].num_train for c in selected) / len(selected)
        per_client = secs * mean_train / max(1, fed.clients[cid].num_train)
        per_round = per_client * expected * len(sim.method.phases(sctx))
        eval_cids = sim.eval_clients(0)
        n_eval = [int(getattr(fed.clients[c], f"{sim.protocol.split}_y").shape[0]) for c in (cid, *eval_cids)]
        per_eval = eval_secs * sum(n_eval[1:]) / max(1, n_eval[0])
        every = max(1, cfg.eval.every)
        evaluations = cfg.rounds // every + (cfg.rounds % every != 0)
        evaluations *= 2 if cfg.eval.select == "val" else 1
        out.update(bytes_up_client=res.reply.num_bytes, bytes_up_round1_estimate=res.reply.num_bytes * len(selected),
                   seconds_one_client=secs, seconds_one_client_eval=eval_secs,
                   seconds_per_round_estimate=per_round, seconds_per_evaluation_estimate=per_eval,
                   evaluations=evaluations,
                   seconds_run_estimate=per_round * cfg.rounds + per_eval * evaluations)
    return out
