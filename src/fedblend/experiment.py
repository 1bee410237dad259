"""Run one experiment from a validated :class:`~fedblend.config.RunConfig` and write its results directory.

Results directory (the run contract other tools rely on)::

    config.toml        the resolved config (every default filled in)
    partition.json     per-client sample indices, class counts and the partition spec (reloadable)
    partition.txt      the per-client class-count table
    metrics.jsonl      one JSON object per round (accuracy, loss, bytes down/up per client, seconds, ...)
    metrics.csv        the scalar columns of metrics.jsonl
    summary.json       best_accuracy, final_accuracy, best_round, global_accuracy (if a global model exists),
                       rounds, seconds_per_round, seed, method, protocol, ...
    checkpoint.pt      the run state every ``checkpoint_every`` rounds (``--resume`` continues from it)
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedblend.config import RunConfig, dump_toml
from fedblend.core.backends import make_backend
from fedblend.core.checkpoint import FILENAME
from fedblend.core.engine import Simulation
from fedblend.data.federated import FederatedData, build_federated, load_partition
from fedblend.data.sources import load_dataset


def build_data(cfg: RunConfig, data_dir: str | Path | None = None) -> FederatedData:
    raw = load_dataset(cfg.dataset, data_dir)
    return build_federated(raw, cfg.partition, cfg.seed)


def summarize(cfg: RunConfig, sim: Simulation, wall: float) -> dict[str, Any]:
    evals = [m for m in sim.history if "acc" in m]
    best = max(evals, key=lambda m: m["acc"]) if evals else {}
    final = evals[-1] if evals else {}
    out: dict[str, Any] = {
        "method": cfg.method,
        "label": cfg.label,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "seed": cfg.seed,
        "rounds": sim.next_round,
        "best_accuracy": best.get("acc"),
        "best_round": best.get("round"),
        "final_accuracy": final.get("acc"),
        "final_acc_client_mean": final.get("acc_client_mean"),
        "final_acc_client_std": final.get("acc_client_std"),
        "final_loss": final.get("loss"),
        "seconds_per_round": _mean([m["seconds"] + m.get("eval_seconds", 0.0) for m in sim.history]),
        "train_seconds_per_round": _mean([m["seconds"] for m in sim.history]),
        "eval_seconds_per_eval": _mean([m["eval_seconds"] for m in evals]),
        "wall_seconds": wall,
        "bytes_down_per_round": _mean([sum(m["bytes_down"]) for m in sim.history]),
        "bytes_up_per_round": _mean([sum(m["bytes_up"]) for m in sim.history]),
        "protocol": {
            "personalized_model": sim.method.describe_eval(),
            "when": "after each round's aggregation (every eval.every rounds and the last)",
            "split": sim.protocol.split,
            "accuracy": "pooled over clients: sum correct / sum samples",
            "headline": sim.protocol.report,
            "sampling": cfg.sampling.scheme,
        },
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
    out["accuracy"] = out["best_accuracy"] if sim.protocol.report == "best" else out["final_accuracy"]
    return out


def run_experiment(cfg: RunConfig, out_dir: str | Path, data_dir: str | Path | None = None,
                   resume: bool = False, progress: Callable[[dict, Simulation], None] | None = None,
                   stop_after: int | None = None) -> dict[str, Any]:
    """Run ``cfg`` writing results under ``out_dir``; ``resume`` continues from ``out_dir/checkpoint.pt``.

    ``stop_after`` ends the call after that many rounds (checkpointing as configured), to emulate a killed run.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ck_path = out / FILENAME
    if resume and not ck_path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {ck_path}")
    raw = load_dataset(cfg.dataset, data_dir)
    part_path = out / "partition.json"
    saved = load_partition(part_path)[0] if resume and part_path.exists() else None
    fed = build_federated(raw, cfg.partition, cfg.seed, indices=saved)
    method = cfg.build_method()
    sim = Simulation.create(method, fed, cfg.model, cfg.train, cfg.rounds, cfg.seed, cfg.sampling, cfg.eval,
                            backend=make_backend(cfg.backend, cfg.workers), device=cfg.resolved_device())
    if resume:
        sim.restore(ck_path)
    else:
        (out / "config.toml").write_text(dump_toml(cfg.to_dict()))
        fed.save(part_path)
        (out / "partition.txt").write_text(fed.table() + "\n")
        (out / "metrics.jsonl").write_text("")
    t0 = time.perf_counter()
    done = 0

    def on_round(m: dict) -> None:
        nonlocal done
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(m) + "\n")
        done += 1
        if progress is not None:
            progress(m, sim)
        if stop_after is not None and done >= stop_after and sim.next_round < cfg.rounds:
            raise _Stop()

    if resume:  # metrics.jsonl must end at the checkpoint's round
        _rewrite_metrics(out, sim.history)
    try:
        with sim:
            sim.run(on_round, checkpoint_dir=out, checkpoint_every=cfg.checkpoint_every)
    except _Stop:
        return {"stopped_at": sim.next_round}
    summary = summarize(cfg, sim, time.perf_counter() - t0)
    _write_csv(out / "metrics.csv", sim.history)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class _Stop(Exception):
    pass


def _rewrite_metrics(out: Path, history: list[dict]) -> None:
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))


def _write_csv(path: Path, history: list[dict]) -> None:
    keys: list[str] = []
    for m in history:
        for k, v in m.items():
            if not isinstance(v, (list, dict)) and k not in keys:
                keys.append(k)
    keys += ["num_selected", "bytes_down_total", "bytes_up_total"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for m in history:
            row = {k: m.get(k, "") for k in keys}
            row.update(num_selected=len(m["selected"]), bytes_down_total=sum(m["bytes_down"]),
                       bytes_up_total=sum(m["bytes_up"]))
            w.writerow(row)


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")


class Progress:
    """A progress display on stderr: a live bar on a terminal, one line per round otherwise."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.last_acc: float | None = None

    def __call__(self, m: dict, sim: Simulation) -> None:
        done = m["round"]
        if "acc" in m:
            self.last_acc = m["acc"]
        el = time.perf_counter() - self.t0
        per = m["seconds"] + m.get("eval_seconds", 0.0)
        eta = per * (self.total - done)
        frac = done / self.total
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        acc = f"acc {self.last_acc:.4f}" if self.last_acc is not None else "acc   -   "
        line = (f"{self.label} [{bar}] round {done}/{self.total} {acc} loss {m['train_loss']:.4f} "
                f"{per:.2f}s/round elapsed {el:.0f}s eta {eta:.0f}s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


