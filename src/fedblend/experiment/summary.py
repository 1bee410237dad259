"""``summary.json``'s numbers from a run's history: the headline (best / final / selected on validation data), the
global model's, the clients' spread, the protocol that produced them, and what clients that did not answer cost."""

from __future__ import annotations

import math
from typing import Any

from fedblend.config import RunConfig
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import client_spread_summary


def selection(evals: list[dict], select: str = "test", report: str = "best") -> dict[str, Any]:
    """The headline numbers of a history's evaluated rounds: best and final test accuracy, and with
    ``select = "val"`` the test accuracy at the round with the best validation accuracy (the first such
    round on ties); ``accuracy`` is the headline."""
    if not evals:
        return {"best_accuracy": None, "best_round": None, "final_accuracy": None, "accuracy": None}
    best = max(evals, key=lambda m: m["acc"])
    final = evals[-1]
    out = {"best_accuracy": best["acc"], "best_round": best["round"], "final_accuracy": final["acc"]}
    if select == "val":
        chosen = max(evals, key=lambda m: m["val_acc"])
        out.update(selected_round=chosen["round"], val_accuracy_at_selected=chosen["val_acc"],
                   test_accuracy_at_best_val=chosen["acc"], accuracy=chosen["acc"])
    else:
        out["accuracy"] = out["best_accuracy"] if report == "best" else out["final_accuracy"]
    return out


def _protocol(cfg: RunConfig, sim: Simulation) -> dict[str, Any]:
    p = sim.protocol
    if p.select == "val":
        headline = ("test accuracy at the round with the best validation accuracy (eval.select = 'val'); best "
                    "and final test accuracy are recorded beside it")
    else:
        headline = (f"{p.report} round's test accuracy, picked on the test split itself (eval.select = 'test'); "
                    f"set eval.select = 'val' to pick the round on validation data" if p.split == "test"
                    else f"{p.report} round's accuracy on the validation split")
    return {
        "personalized_model": sim.method.traits.eval_model,
        "model": sim.method.traits.eval_choice,  # eval.model in force (the config records it only when not the default)
        "when": "after each round's aggregation (every eval.every rounds and the last)",
        "split": p.split,
        "accuracy": "pooled over clients: sum correct / sum samples",
        "headline": headline,
        "selection": p.select,
        "sampling": cfg.sampling.scheme,
    }


def summarize(cfg: RunConfig, sim: Simulation, wall: float) -> dict[str, Any]:
    evals = [m for m in sim.history if "acc" in m]
    final = evals[-1] if evals else {}
    sel = selection(evals, sim.protocol.select, sim.protocol.report)
    out: dict[str, Any] = {
        "status": "finished",
        "method": cfg.method,
        "label": cfg.label,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "seed": cfg.seed,
        "rounds": sim.next_round,
        **{k: v for k, v in sel.items() if k != "accuracy"},
        "final_acc_client_mean": final.get("acc_client_mean"),
        "final_acc_client_std": final.get("acc_client_std"),
        "final_loss": final.get("loss"),
        "seconds_per_round": _mean([m["seconds"] + m.get("eval_seconds", 0.0) for m in sim.history]),
        "train_seconds_per_round": _mean([m["seconds"] for m in sim.history]),
        "eval_seconds_per_eval": _mean([m["eval_seconds"] for m in evals]),
        "wall_seconds": wall,
        "bytes_down_per_round": _mean([sum(m["bytes_down"]) for m in sim.history]),
        "bytes_up_per_round": _mean([sum(m["bytes_up"]) for m in sim.history]),
        "on_nonfinite": sim.on_nonfinite,
        "on_divergence": sim.on_divergence,
        "nonfinite_skipped": [{"round": m["round"], "clients": m["nonfinite_clients"]}
                              for m in sim.history if m.get("nonfinite_clients")],
        "protocol": _protocol(cfg, sim),
    }
    if evals and "global_acc" in evals[0]:
        gbest = max(evals, key=lambda m: m["global_acc"])
        out.update(global_accuracy=gbest["global_acc"] if sim.protocol.report == "best" else final["global_acc"],
                   global_best_accuracy=gbest["global_acc"], global_best_round=gbest["round"],
                   global_final_accuracy=final["global_acc"])
    if sim.protocol.target is not None:
        hit = [m["round"] for m in evals if m["acc"] >= sim.protocol.target]
        out.update(target_accuracy=sim.protocol.target, rounds_to_target=hit[0] if hit else None)
    for tag in ("bp", "ap"):
        vals = [m[f"{tag}_acc"] for m in sim.history if f"{tag}_acc" in m]
        if vals:
            out[f"{tag}_best_accuracy"], out[f"{tag}_final_accuracy"] = max(vals), vals[-1]
    headline_round = sel.get("selected_round", sel["best_round"] if sim.protocol.report == "best" else
                             (evals[-1]["round"] if evals else None))
    out.update(client_spread_summary(evals, headline_round))  # worst client, 10th percentile, std
    lost = lost_clients(sim.history, headline_round)
    if lost:  # a backend that tolerates faults (Flower) went on without some clients: no full result
        out.update(status=DEGRADED, clients_lost=lost, degraded=lost["text"])
    out["accuracy"] = sel["accuracy"]
    return out


#: summary.json's status of a run that did all its rounds but without some clients' replies (a Flower node down,
#: a timeout, a refused reply): its numbers are over the clients that answered, so it is no full result
DEGRADED = "finished-degraded"


def lost_clients(history: list[dict], headline_round: int | None) -> dict[str, Any] | None:
    """What a run lost to clients that did not answer (``dropped_clients`` in training, ``eval_missing`` in
    evaluation, the backend's ``flower_faults`` for why), or None when it lost nothing: the rounds, the clients,
    how many of the clients asked were evaluated at the headline round, and one sentence saying it."""
    dropped = {m["round"]: list(m["dropped_clients"]) for m in history if m.get("dropped_clients")}
    missing = {m["round"]: int(m["eval_missing"]) for m in history if m.get("eval_missing")}
    if not dropped and not missing:
        return None
    clients = sorted({c for cs in dropped.values() for c in cs})
    reasons = list(dict.fromkeys(f.get("reason", "") for m in history for f in m.get("flower_faults") or ()))
    out: dict[str, Any] = {"clients": clients, "rounds": sorted(set(dropped) | set(missing)),
                           "dropped": {str(r): c for r, c in dropped.items()},
                           "eval_missing": {str(r): n for r, n in missing.items()}, "reasons": reasons[:5]}
    parts = [f"client(s) {clients} did not answer in training in round(s) {sorted(dropped)}"] if dropped else []
    row = next((m for m in history if m.get("round") == headline_round), None)
    if row is not None and isinstance(row.get("per_client"), dict):
        evaluated = len(row["per_client"].get("clients", ()))
        asked = evaluated + int(row.get("eval_missing", 0))
        out["headline_evaluated"] = {"round": headline_round, "evaluated": evaluated, "of": asked}
        acc = f" {row['acc']:.4f}" if isinstance(row.get("acc"), float) else ""
        parts.append(f"the headline accuracy{acc} (round {headline_round}) is over the {evaluated} of {asked} "
                     f"clients evaluated")
    if missing:
        parts.append(f"evaluations missing in round(s) {sorted(missing)}")
    text = "; ".join(parts) + (f" (first reason: {reasons[0]})" if reasons else "")
    out["text"] = text
    return out


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")
