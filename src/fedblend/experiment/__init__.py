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

The package: :mod:`~fedblend.experiment.setup` (the data and the simulation of a config),
:mod:`~fedblend.experiment.identity` (what produced a result), :mod:`~fedblend.experiment.resume` (the checks
before ``--resume``), :mod:`~fedblend.experiment.loop` (the rounds and what each writes),
:mod:`~fedblend.experiment.summary` (``summary.json``), :mod:`~fedblend.experiment.outputs` (the files),
:mod:`~fedblend.experiment.dryrun`; this module runs a config in its locked results directory.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedblend.common import files
from fedblend.common.argtypes import bool_arg, int_arg, path_arg
from fedblend.common.errors import DivergedError, RunInterrupted
from fedblend.common.guard import guarded
from fedblend.config import RunConfig, check_config, check_model_fits, dump_toml
from fedblend.core.checkpoint import FILENAME, load_checkpoint, verify_checkpoint
from fedblend.core.engine import Simulation
from fedblend.core.state import DiskStore
from fedblend.data.federated import FederatedData, build_federated, load_partition
from fedblend.data.sources import load_dataset, require_packages
from fedblend.experiment.dryrun import dry_run
from fedblend.experiment.identity import (
    config_header,
    cpu_identity,
    git_commit,
    keep_cpu_history,
    keep_start_inputs,
    run_identity,
)
from fedblend.experiment.loop import interrupted_message, run_loop
from fedblend.experiment.outputs import clear, default_out_dir, rewrite_metrics, write
from fedblend.experiment.resume import check_checkpoint_files, check_resume
from fedblend.experiment.setup import build_data, check_backend, create_simulation, worker_count
from fedblend.experiment.summary import DEGRADED, lost_clients, selection, summarize
from fedblend.plugin_code import check_plugin_code
from fedblend.results.figures import plot_run
from fedblend.rundir import RUN_FILES, DirLock, check_out_dir
from fedblend.tracking import check_available, make_trackers

__all__ = ["DEGRADED", "build_data", "check_backend", "check_checkpoint_files", "check_resume", "config_header",
           "cpu_identity", "create_simulation", "default_out_dir", "dry_run", "git_commit", "keep_cpu_history",
           "keep_start_inputs", "lost_clients", "run_experiment", "run_identity", "selection", "summarize",
           "worker_count"]

log = logging.getLogger("fedblend.run")

assert FILENAME in RUN_FILES  # the run files (fedblend.rundir, which --force and the lock use)


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
    ck = _checkpoint(cfg, out, ck_path) if resume else None
    identity = _identity(cfg, device, ck, ck_path, allow_code_change)
    raw = load_dataset(cfg.dataset, data_dir)
    part_path = out / "partition.json"
    saved = load_partition(part_path)[0] if resume and part_path.exists() else None
    fed = build_federated(raw, cfg.partition, cfg.seed, indices=saved, source=str(part_path))
    sim = create_simulation(cfg, fed, device=device, backend=backend, method=method)
    sim.on_client = getattr(progress, "on_client", None)
    start = 0
    try:
        start = _open_run_dir(cfg, sim, fed, out, ck, ck_path, created, device)
        ck_files = {"partition.json": files.sha256_file(part_path)}
        write(out / "config.toml", config_header(identity) + dump_toml(identity["config"]))
        summary = _rounds(cfg, sim, out, identity, progress, stop_after, ck_files)
        if cfg.log.plot and "stopped_at" not in summary:
            plot_run(out)
    except BaseException as exc:
        # a fresh run that recorded nothing leaves nothing behind (a non-finite stop keeps its summary)
        fresh_nothing_done = ck is None and sim.next_round == 0 and not isinstance(exc, DivergedError)
        if fresh_nothing_done:
            clear(out, created)
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, RunInterrupted):
            raise RunInterrupted(interrupted_message(cfg, sim, out, start, fresh_nothing_done, command),
                                 sim.next_round) from None
        raise
    return summary


def _checkpoint(cfg: RunConfig, out: Path, ck_path: Path) -> dict:
    """``--resume``: the checkpoint (its bytes checked against the sha256 recorded when it was written), checked
    to continue this config on the partition it was written with."""
    verify_checkpoint(ck_path)
    ck = load_checkpoint(ck_path)
    if ck is not None:
        check_resume(ck, cfg, ck_path)
        check_checkpoint_files(ck, out, ck_path)
    return ck


def _identity(cfg: RunConfig, device: str, ck: dict | None, ck_path: Path, allow_code_change: bool) -> dict:
    """The run identity; on ``--resume`` checked against (plug-in code) and merged with (input files, CPUs) the
    one the run started under."""
    identity = run_identity(cfg, device)
    if ck is not None:
        started = (ck.get("extra") or {}).get("identity") or {}
        check_plugin_code(identity, started, ck_path, allow_code_change)
        keep_start_inputs(identity, started, ck_path)
        keep_cpu_history(identity, started)
    return identity


def _open_run_dir(cfg: RunConfig, sim: Simulation, fed: FederatedData, out: Path, ck: dict | None, ck_path: Path,
                  created: bool, device: str) -> int:
    """The results directory and the simulation ready for the first round to run: restored from the checkpoint
    (``metrics.jsonl`` cut back to its round), or fresh (the old run's files gone, the partition written, the
    metrics empty); the round the run starts at."""
    part_path = out / "partition.json"
    start = 0
    if cfg.store == "disk":  # one file per client under OUT/clients (a fresh run starts it empty)
        if ck is None:
            for d in ("clients", "clients.ckpt"):
                shutil.rmtree(out / d, ignore_errors=True)
        sim.store = DiskStore(out / "clients", device)
    if ck is not None:
        sim.restore(ck_path, ck)
        start = sim.next_round
        log.info("resuming %s from its checkpoint after round %d of %d", out, start, cfg.rounds)
        rewrite_metrics(out, sim.history)  # metrics.jsonl must end at the checkpoint's round
    else:
        if not created:
            clear(out, created=False)  # --force: no file of the old run survives
        out.mkdir(parents=True, exist_ok=True)
        fed.save(part_path)
        write(out / "partition.txt", fed.table() + "\n")
        write(out / "metrics.jsonl", "")
    if not part_path.exists():  # resuming a checkpoint of an older fedblend without its partition.json
        fed.save(part_path)
    return start


def _rounds(cfg: RunConfig, sim: Simulation, out: Path, identity: dict, progress, stop_after, ck_files: dict) -> dict:
    """The run's rounds with the trackers ``[log]`` asks for (TensorBoard, MLflow, W&B), closed at the end."""
    trackers = make_trackers(cfg.log, out, identity)
    try:
        return run_loop(cfg, sim, out, identity, progress, stop_after, trackers, ck_files)
    finally:
        for tr in trackers:
            with guarded(tr, "tracker", "close", side=""):
                tr.close()
