"""Run one experiment from a validated :class:`~fedblend.config.RunConfig` and write its results directory.

Results directory (the run contract other tools rely on)::

    config.toml        the resolved config (every default filled in, method and transform tables included),
                       headed by comments with its hash and the run identity
    partition.json     per-client sample indices, class counts and the partition spec (reloadable)
    partition.txt      the per-client class-count table
    metrics.jsonl      one JSON object per round (accuracy, loss, bytes down/up per client, seconds, ...; each
                       evaluated round's per_client: {clients, correct, n}); a run stopped by a non-finite update
                       ends with a row saying so; a round in which the run diverged carries "diverged": reason
    metrics.csv        the scalar columns of metrics.jsonl
    accuracy.png       personalized accuracy per round with the clients' spread (and the global model's),
                       titled by method and setting, written at the end ([log] plot)
    tensorboard/       TensorBoard event files of every metrics row, as they happen ([log] tensorboard)
    mlruns/, wandb/    the same in a local MLflow store ([log] mlflow; .mlflow_run names the run) and an offline
                       W&B run ([log] wandb)
    summary.json       status ("finished"; "finished-degraded" when clients did not answer in some rounds,
                       e.g. a Flower node down: clients_lost and degraded say which, where, and over how many
                       clients the headline was measured; or "diverged" with divergence = {round, reason}: a
                       diverged run is never a result), best_accuracy, final_accuracy, best_round,
                       global_accuracy (if a global model exists), the clients' spread (worst client, 10th
                       percentile, std at the final and headline rounds), rounds, seconds_per_round, seed, method,
                       protocol, config_hash and run (the identity: resolved config, versions, git commit,
                       device, threads, and the sha256 of each input file the config names: ``inputs``)
    checkpoint.pt      the run state every ``checkpoint_every`` rounds (``--resume`` continues from it), with
                       the identity it was written under; checkpoint.pt.sha256 records its sha256, which
                       ``--resume`` checks first (:mod:`fedblend.core.checkpoint`)

Every results file is strict JSON (non-finite numbers as null). Before anything is loaded or written the
model is checked against the dataset, the output directory is checked (a directory holding a run needs
``resume`` or ``force``; an unwritable place fails) and, on ``resume``, the checkpoint's config is compared
with this one (only ``rounds`` may grow; the runtime-only ``backend`` / ``workers`` may differ). A fresh run
that fails before its first round leaves nothing behind.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import platform
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedblend
from fedblend.common import files
from fedblend.common.argtypes import bool_arg, int_arg, path_arg
from fedblend.common.errors import (
    CheckpointMismatchError,
    ConfigError,
    DivergedError,
    NonFiniteError,
    ResumeMismatchError,
    RunInterrupted,
)
from fedblend.common.guard import guarded
from fedblend.common.jsonio import dumps
from fedblend.config import (
    RUNTIME_ONLY,
    RunConfig,
    check_config,
    check_model_fits,
    config_diff,
    config_hash,
    dump_toml,
    migrate_eval,
    with_new_defaults,
)
from fedblend.core.backends import make_backend
from fedblend.core.checkpoint import FILENAME, load_checkpoint, verify_checkpoint
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import client_spread_summary
from fedblend.core.state import DiskStore
from fedblend.data.federated import FederatedData, build_federated, load_partition
from fedblend.data.sources import load_dataset, require_packages
from fedblend.plugin_code import check_plugin_code, plugin_code
from fedblend.results.figures import plot_run
from fedblend.rundir import RUN_FILES, DirLock, check_out_dir, clear_run, holds_run, locked_by
from fedblend.tracking import check_available, make_trackers

log = logging.getLogger("fedblend.run")

assert FILENAME in RUN_FILES  # the run files (fedblend.rundir, which --force and the lock use)


def build_data(cfg: RunConfig, data_dir: str | Path | None = None) -> FederatedData:
    raw = load_dataset(cfg.dataset, data_dir)
    return build_federated(raw, cfg.partition, cfg.seed)


# ------------------------------------------------------------------------------------------------ identity
def git_commit() -> str | None:
    """The commit of the checkout fedblend is imported from (``+dirty`` with uncommitted changes), or None."""
    src = Path(fedblend.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_identity() -> dict[str, str]:
    """The CPU a run computed on: torch's kernel level (``capability``: e.g. ``AVX512``, ``AVX2``, ``DEFAULT``),
    which decides the last bits of every float result, and the processor's name (``model``)."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"capability": str(torch.backends.cpu.get_cpu_capability()),
            "model": model or platform.processor() or platform.machine()}


def run_identity(cfg: RunConfig, device: str) -> dict[str, Any]:
    """What produced a result: the resolved config and its hash, versions, git commit, device, threads, the CPU
    (:func:`cpu_identity`), each plug-in's package version and source sha256 (``plugins``:
    :func:`fedblend.plugin_code.plugin_code`), and
    (``inputs``, only when the config names one) the sha256 of each file the run reads besides the dataset: the
    config records a path, the same path can hold another file (a re-made agent, a new init), and the hash tells
    the two runs apart."""
    resolved = cfg.resolved()
    identity = {"config_hash": config_hash(resolved), "config": resolved, "fedblend": fedblend.__version__,
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "git_commit": git_commit(), "device": device, "threads": torch.get_num_threads(),
                "cpu": cpu_identity()}
    inputs = cfg.input_digests()
    if inputs:
        identity["inputs"] = inputs
    plugins = plugin_code(cfg)  # a plug-in's code is not fedblend's: its own version and source hash
    if plugins:
        identity["plugins"] = plugins
    return identity


def keep_start_inputs(identity: dict, old: dict, ck_path: Path) -> None:
    """On ``--resume``: the identity keeps the input files the run started from (the checkpoint holds what was
    read from them), with a warning for each that has changed since."""
    if "inputs" not in old:
        return
    for key, was in old["inputs"].items():
        now = identity.get("inputs", {}).get(key)
        if now != was:
            warnings.warn(f"{key}: {was['path']} is not the file {ck_path.parent} started from (sha256 "
                          f"{was['sha256'][:12]}..., now {now['sha256'][:12] + '...' if now else 'missing'}); the run "
                          f"continues from its checkpoint and records the file it started from", RuntimeWarning,
                          stacklevel=3)
    identity["inputs"] = old["inputs"]


def keep_cpu_history(identity: dict, old: dict) -> None:
    """On ``--resume``: when the run's last part ran on a CPU whose torch kernels differ from this one's, warn
    (float results may differ from an uninterrupted run's in the last bits); when any part did, list each CPU in
    order under ``cpu_history``."""
    cpus = old.get("cpu_history") or ([old["cpu"]] if old.get("cpu") else [])
    if cpus and cpus[-1]["capability"] != identity["cpu"]["capability"]:
        warnings.warn(f"resuming on a CPU whose torch kernels are {identity['cpu']['capability']}, the run "
                      f"started on {cpus[-1]['capability']} ({cpus[-1].get('model')}): float results may differ from "
                      f"an uninterrupted run in the last bits (the summary's run.cpu_history records each CPU)",
                      RuntimeWarning, stacklevel=3)
    if cpus and cpus[-1] != identity["cpu"]:
        cpus = [*cpus, identity["cpu"]]
    if len(cpus) > 1:  # computed on more than one CPU: each, in order
        identity["cpu_history"] = cpus


def check_resume(ck: dict, cfg: RunConfig, ck_path: Path) -> None:
    """Refuse to continue a checkpoint under a different config (listing the differing fields); only
    ``rounds`` may grow, and the runtime-only fields may differ. Warns when the thread count differs (results
    are bit-identical only at the same per-process thread count)."""
    old = (ck.get("extra") or {}).get("identity")
    if not old:
        raise ResumeMismatchError(f"{ck_path} records no config (written by an older fedblend), so --resume "
                                  f"cannot check it continues the same run; start again with --force")
    if "config_hash" in old and config_hash(old["config"]) != old["config_hash"]:
        raise CheckpointMismatchError(f"--resume: {ck_path} records config hash {old['config_hash']} but its config "
                                      f"hashes to {config_hash(old['config'])} (the checkpoint was altered); start "
                                      f"again with --force")
    new = cfg.resolved()
    # a run started before [eval] model (its evaluation options moved there) or before an option existed (at its
    # default, the behaviour the run had)
    was = with_new_defaults(migrate_eval(old["config"])[0])
    diffs = config_diff(was, new, ignore=RUNTIME_ONLY + ("rounds",))
    if new["rounds"] < old["config"]["rounds"]:
        diffs.append(f"rounds: {old['config']['rounds']!r} -> {new['rounds']!r} (a resumed run can only be "
                     f"extended)")
    if diffs:
        raise ResumeMismatchError(f"--resume: the config differs from the one {ck_path.parent} was run with: "
                                  f"{'; '.join(diffs)}. Resume with {ck_path.parent / 'config.toml'} (plus a "
                                  f"larger rounds), or start a new run (another --out, or --force)")
    if old.get("threads") != torch.get_num_threads():
        warnings.warn(f"resuming with {torch.get_num_threads()} threads, the run used {old.get('threads')}: "
                      f"results may differ from an uninterrupted run in the last bits (use --threads "
                      f"{old.get('threads')})", RuntimeWarning, stacklevel=3)


def check_checkpoint_files(ck: dict, out: Path, ck_path: Path) -> None:
    """Refuse to resume when ``partition.json`` is not the file the checkpoint was written with (missing or
    changed: its sha256 is recorded in the checkpoint). The client snapshot is checked when it is restored
    (:func:`fedblend.core.state.verify_snapshot`)."""
    want = ((ck.get("extra") or {}).get("files") or {}).get("partition.json")
    if want is None:  # an older fedblend recorded no hashes
        return
    part = out / "partition.json"
    if not part.is_file():
        raise CheckpointMismatchError(f"--resume: {part} is missing; {ck_path} was written with it (the clients' "
                                      f"data): restore it, or start again with --force")
    if files.sha256_file(part) != want:
        raise CheckpointMismatchError(f"--resume: {part} changed since {ck_path} was written (sha256 differs), so "
                                      f"the clients' data would not be the run's: restore it, or start again with "
                                      f"--force")


# ------------------------------------------------------------------------------------------ results dir
def default_out_dir(cfg: RunConfig, base: str | Path = "runs") -> Path:
    """``runs/<label>-seed<N>``, or the first of ``...-2``, ``...-3``, ... that holds no run: a run without
    ``--out`` never lands on an earlier one."""
    stem = Path(base) / f"{cfg.label}-seed{cfg.seed}"
    out, k = stem, 1
    while holds_run(out) or (out.exists() and not out.is_dir()) or locked_by(out) is not None:
        k += 1
        out = stem.with_name(f"{stem.name}-{k}")
    return out


def _write(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file and a rename, so a failed write leaves the old file whole (and no
    temporary file)."""
    files.write_atomic(path, text.encode())


def _clear(out: Path, created: bool) -> None:
    """Remove what a run owns in ``out`` (a failed fresh run's files, or the old run on ``--force``: files,
    client folders, TensorBoard events; :func:`fedblend.rundir.clear_run`). The directory itself, when this run
    created it, goes when its lock is released and it is empty."""
    clear_run(out)


# ------------------------------------------------------------------------------------------------ summary
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


# ------------------------------------------------------------------------------------------------ dry run
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


# ------------------------------------------------------------------------------------------------ the run
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


def run_experiment(cfg: RunConfig, out_dir: str | Path, data_dir: str | Path | None = None,
                   resume: bool = False, progress: Callable[[dict, Simulation], None] | None = None,
                   stop_after: int | None = None, force: bool = False, backend: Any = None,
                   command: str | None = None, allow_code_change: bool = False, method: Any = None) -> dict[str, Any]:
    """Run ``cfg`` writing results under ``out_dir``; ``resume`` continues from ``out_dir/checkpoint.pt``,
    ``force`` replaces a run already there; ``allow_code_change``: resume even when a plug-in's code changed since
    the run started (:mod:`fedblend.plugin_code`; refused otherwise). ``command`` is the command line that runs it
    again, named by the Ctrl-C message with ``--resume`` or ``--force`` added (default ``fedblend run
    OUT/config.toml --out OUT``; ``fedblend pretrain`` passes its own).

    Raises the typed errors of :mod:`fedblend.common.errors` (and the data layer's) for every expected failure;
    Ctrl-C becomes :class:`RunInterrupted` saying how to resume. ``stop_after`` ends the call after that many
    rounds (checkpointing as configured), to emulate a killed run. ``backend`` replaces the config's (the Flower
    ServerApp passes its Flower backend: same loop, same results directory), ``method`` the method built from the
    config (:func:`create_simulation`).

    The config is validated again here (a config changed through the Python API after ``load_config`` is
    checked like a loaded one), and ``out_dir`` is locked for the whole run (:class:`fedblend.rundir.DirLock`:
    a second writer is refused with :class:`~fedblend.rundir.RunLockedError`).
    """
    out = path_arg(out_dir, "out_dir", optional=False)
    data_dir = path_arg(data_dir, "data_dir")
    resume, force = bool_arg(resume, "resume"), bool_arg(force, "force")
    allow_code_change = bool_arg(allow_code_change, "allow_code_change")
    stop_after = int_arg(stop_after, "stop_after")
    if command is not None and not isinstance(command, str):
        raise TypeError(f"command must be a str or None, got {type(command).__name__}")
    cfg = check_config(cfg)
    check_backend(cfg, backend)
    check_model_fits(cfg.model, cfg.dataset)
    require_packages(cfg.dataset)  # a missing optional package stops the run before it writes anything
    device = cfg.resolved_device()
    check_out_dir(out, resume, force)  # before the lock creates anything
    with DirLock(out) as lock:
        check_out_dir(out, resume, force)  # again, now that no other process can change it
        return _run_locked(cfg, out, data_dir, resume, progress, stop_after, backend, device, created=bool(lock.created),
                           command=command or f"fedblend run {out / 'config.toml'} --out {out}",
                           allow_code_change=allow_code_change, method=method)


def _run_locked(cfg: RunConfig, out: Path, data_dir, resume: bool, progress, stop_after, backend, device: str,
                created: bool, command: str, allow_code_change: bool = False, method: Any = None) -> dict[str, Any]:
    check_available(cfg.log)
    ck_path = out / FILENAME
    if resume:
        verify_checkpoint(ck_path)  # its bytes against the sha256 recorded when it was written
    ck = load_checkpoint(ck_path) if resume else None
    if ck is not None:
        check_resume(ck, cfg, ck_path)
        check_checkpoint_files(ck, out, ck_path)
    identity = run_identity(cfg, device)
    if ck is not None:
        started = (ck.get("extra") or {}).get("identity") or {}
        check_plugin_code(identity, started, ck_path, allow_code_change)
        keep_start_inputs(identity, started, ck_path)
        keep_cpu_history(identity, started)
    raw = load_dataset(cfg.dataset, data_dir)
    part_path = out / "partition.json"
    saved = load_partition(part_path)[0] if resume and part_path.exists() else None
    fed = build_federated(raw, cfg.partition, cfg.seed, indices=saved, source=str(part_path))
    sim = create_simulation(cfg, fed, device=device, backend=backend, method=method)
    sim.on_client = getattr(progress, "on_client", None)
    start = 0
    try:
        if cfg.store == "disk":  # one file per client under OUT/clients (a fresh run starts it empty)
            if ck is None:
                for d in ("clients", "clients.ckpt"):
                    shutil.rmtree(out / d, ignore_errors=True)
            sim.store = DiskStore(out / "clients", device)
        if ck is not None:
            sim.restore(ck_path, ck)
            start = sim.next_round
            log.info("resuming %s from its checkpoint after round %d of %d", out, start, cfg.rounds)
            _rewrite_metrics(out, sim.history)  # metrics.jsonl must end at the checkpoint's round
        else:
            if not created:
                _clear(out, created=False)  # --force: no file of the old run survives
            out.mkdir(parents=True, exist_ok=True)
            fed.save(part_path)
            _write(out / "partition.txt", fed.table() + "\n")
            _write(out / "metrics.jsonl", "")
        if not part_path.exists():  # resuming a checkpoint of an older fedblend without its partition.json
            fed.save(part_path)
        ck_files = {"partition.json": files.sha256_file(part_path)}
        _write(out / "config.toml", config_header(identity) + dump_toml(identity["config"]))
        trackers = make_trackers(cfg.log, out, identity)  # TensorBoard, MLflow, W&B as [log] asks
        try:
            summary = _run_loop(cfg, sim, out, identity, progress, stop_after, trackers, ck_files)
        finally:
            for tr in trackers:
                with guarded(tr, "tracker", "close", side=""):
                    tr.close()
        if cfg.log.plot and "stopped_at" not in summary:
            plot_run(out)
    except BaseException as exc:
        # a fresh run that recorded nothing leaves nothing behind (a non-finite stop keeps its summary)
        fresh_nothing_done = ck is None and sim.next_round == 0 and not isinstance(exc, DivergedError)
        if fresh_nothing_done:
            _clear(out, created)
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
            raise RunInterrupted(_interrupted(cfg, sim, out, start, fresh_nothing_done, command),
                                 sim.next_round) from None
        raise
    return summary


def _run_loop(cfg: RunConfig, sim: Simulation, out: Path, identity: dict, progress, stop_after,
              trackers: list = (), ck_files: dict | None = None) -> dict:
    t0 = time.perf_counter()
    done = 0

    def on_round(m: dict) -> None:
        nonlocal done
        files.append_text(out / "metrics.jsonl", dumps(m) + "\n")
        for tr in trackers:
            with guarded(tr, "tracker", "log", m["round"] - 1, side=""):
                tr(m)
        done += 1
        if progress is not None:
            progress(m, sim)
        if stop_after is not None and done >= stop_after and sim.next_round < cfg.rounds:
            raise _Stop()

    try:
        with sim:
            sim.run(on_round, checkpoint_dir=out, checkpoint_every=cfg.checkpoint_every,
                    extra_state={"identity": identity, "files": ck_files or {}})
    except _Stop:
        return {"stopped_at": sim.next_round}
    except DivergedError as exc:
        if isinstance(exc, NonFiniteError):  # stopped inside the round, before aggregating
            files.append_text(out / "metrics.jsonl", dumps(
                {"round": exc.round, "stopped": "nonfinite", "nonfinite_clients": [exc.client], "tensor": exc.tensor,
                 "on_nonfinite": "stop"}) + "\n")
        elif sim.history and sim.history[-1].get("diverged"):  # the diverged round's row, then the stop
            files.append_text(out / "metrics.jsonl", dumps(sim.history[-1]) + "\n")
            files.append_text(out / "metrics.jsonl", dumps({"round": exc.round, "stopped": "diverged",
                                                            "reason": exc.reason}) + "\n")
        summary = summarize(cfg, sim, time.perf_counter() - t0)
        summary.update(status="diverged", stop_reason=str(exc), divergence={"round": exc.round, "reason": exc.reason})
        if isinstance(exc, NonFiniteError):
            summary["nonfinite"] = {"round": exc.round, "client": exc.client, "tensor": exc.tensor}
        _finish(out, sim, summary, identity)
        raise
    summary = summarize(cfg, sim, time.perf_counter() - t0)
    if sim.diverged is not None:  # on_divergence = "warn": the run went on, but it is no result
        d = sim.diverged
        summary.update(status="diverged", divergence=d, stop_reason=f"round {d['round']}: {d['reason']}")
        _finish(out, sim, summary, identity)
        raise DivergedError(f"round {d['round']}: the run diverged: {d['reason']}. It went on to round "
                            f"{sim.next_round} (on_divergence = 'warn'), and its summary says status 'diverged' "
                            f"(no result)", d["round"], d["reason"])
    _finish(out, sim, summary, identity)
    return summary


def _finish(out: Path, sim: Simulation, summary: dict, identity: dict) -> None:
    summary.update(config_hash=identity["config_hash"], run=identity)
    _write_csv(out / "metrics.csv", sim.history)
    _write(out / "summary.json", dumps(summary, indent=2) + "\n")


def config_header(identity: dict) -> str:
    """Comment lines heading ``config.toml``: the hash and what produced the run (TOML ignores them)."""
    keys = ("config_hash", "fedblend", "torch", "numpy", "python", "git_commit", "device", "threads")
    inputs = "".join(f"# input {k}: {v['path']} sha256 {v['sha256']}\n" for k, v in identity.get("inputs", {}).items())
    return "".join(f"# {k}: {identity[k]}\n" for k in keys) + inputs + "\n"


def _interrupted(cfg: RunConfig, sim: Simulation, out: Path, start: int, nothing_kept: bool, command: str) -> str:
    n = sim.next_round
    if nothing_kept:
        return f"interrupted before round 1 finished; nothing was kept in {out}"
    k = cfg.checkpoint_every
    last_ck = max(start, (n // k) * k) if k > 0 else start
    if last_ck == 0:
        return (f"interrupted after round {n}; no checkpoint was written yet (checkpoint_every = {k}), so it "
                f"cannot be resumed: run again with: {command} --force")
    return (f"interrupted after round {n}; resume with: {command} --resume"
            + (f" (continues from the checkpoint of round {last_ck})" if last_ck != n else ""))


class _Stop(Exception):
    pass


def _rewrite_metrics(out: Path, history: list[dict]) -> None:
    _write(out / "metrics.jsonl", "".join(dumps(m) + "\n" for m in history))


def _write_csv(path: Path, history: list[dict]) -> None:
    keys: list[str] = []
    for m in history:
        for k, v in m.items():
            if not isinstance(v, (list, dict)) and k not in keys:
                keys.append(k)
    keys += ["num_selected", "bytes_down_total", "bytes_up_total"]
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for m in history:
        row = {k: m.get(k, "") for k in keys}
        row.update(num_selected=len(m["selected"]), bytes_down_total=sum(m["bytes_down"]),
                   bytes_up_total=sum(m["bytes_up"]))
        w.writerow(row)
    files.write_atomic(path, f.getvalue().encode())


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else float("nan")
