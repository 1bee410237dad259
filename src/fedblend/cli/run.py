"""``fedblend run CONFIG.toml [--set key=value ...] [--out DIR] [--resume | --force]``: one experiment (also on
Flower's Simulation Engine with ``--backend flower-sim``); ``--check`` / ``--dry-run`` check it and stop."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.flags import int_in
from fedblend.common.errors import ConfigError

RESULT_KEYS = ["method", "seed", "rounds", "best_accuracy", "final_accuracy", "global_accuracy", "seconds_per_round"]


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="run one experiment")
    cli_args.common(run)
    run.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same config; rounds "
                     "may grow)")
    run.add_argument("--force", action="store_true", help="replace a run already in OUT (everything the old run "
                     "wrote there is removed first)")
    run.add_argument("--allow-code-change", action="store_true", help="with --resume: continue even when a "
                     "plug-in's source changed since the run started (refused otherwise; the summary records both)")
    run.add_argument("--threads", type=int_in(flags.THREADS), default=1, help="torch CPU threads (default 1, as "
                     "sweep: small models on a shared CPU run fastest so; measured in docs/benchmarks.md)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--check", action="store_true", help="check the config, OUT, the data, the partition and the "
                     "model as a run would before its first round, and stop: the --dry-run without timing a client "
                     "(fast; writes nothing)")
    run.add_argument("--dry-run", action="store_true", help="check everything (config, data, partition, model), "
                     "print parameters, bytes per round and a time estimate; write nothing")
    cli_args.runtime_flags(run)


def command(args: argparse.Namespace) -> int:
    from fedblend.progress import Progress

    cfg = cli_args.run_config(args)
    cli_args.refuse_resume_and_force(args)
    if args.allow_code_change and not args.resume:
        raise ConfigError("--allow-code-change applies to --resume only (a new run records the code it runs)")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = out_dir(cfg, args)
    if args.dry_run or args.check:
        return _check(cfg, args, out)
    progress = None if args.quiet else Progress(cfg.rounds, cfg.label)
    try:
        summary = _train(cfg, args, out, progress)
    finally:
        if hasattr(progress, "close"):  # any callable may stand in for the display (tests do)
            progress.close()
    cli_args.result_line(summary, RESULT_KEYS)
    print(f"results in {out}")
    return 0


def out_dir(cfg, args: argparse.Namespace) -> Path:
    """``--out``; else a new directory under ``runs/`` (a new run never lands on an earlier one; ``--resume``
    continues the first)."""
    from fedblend.experiment import default_out_dir

    if args.out:
        return Path(args.out)
    return Path("runs") / f"{cfg.label}-seed{cfg.seed}" if args.resume else default_out_dir(cfg)


def _check(cfg, args: argparse.Namespace, out: Path) -> int:
    """``--check`` / ``--dry-run``: everything a run checks before its first round (``--dry-run``: timed)."""
    from fedblend.experiment import dry_run
    from fedblend.rundir import check_out_dir

    if args.check:
        check_out_dir(out, args.resume, args.force)
    print(dry_run_text(dry_run(cfg, args.data_dir, time_client=not args.check)))
    return 0


def _train(cfg, args: argparse.Namespace, out: Path, progress) -> dict:
    """The run, on the configured backend; its summary."""
    from fedblend.experiment import run_experiment

    if cfg.backend == "flower-sim":  # Flower's Simulation Engine drives the same run (docs/deploy.md)
        try:
            from fedblend.flower.sim import simulate
        except ImportError as exc:
            raise ConfigError(f"--backend flower-sim needs Flower and Ray: pip install 'fedblend[simulation]' "
                              f"({exc})") from exc
        return simulate(cfg, out, args.data_dir, resume=args.resume, force=args.force, progress=progress)
    return run_experiment(cfg, out, args.data_dir, resume=args.resume, progress=progress, force=args.force,
                          allow_code_change=args.allow_code_change)


def dry_run_text(d: dict) -> str:
    lines = [f"dry run of {d['label']} (config {d['config_hash']}): nothing written",
             f"  clients {d['num_clients']}, train samples {d['train_samples']:,}, test samples {d['test_samples']:,}",
             f"  parameters {d['parameters']:,} ({d['parameter_bytes'] / 2**20:.2f} MiB)",
             f"  clients per round {d['clients_per_round_expected']:.1f} (round 1: {d['clients_round1']})",
             f"  bytes down round 1: {d['bytes_down_round1']:,}"]
    if "seconds_one_client" in d:
        lines += [f"  bytes up round 1 (estimated from one client): {d['bytes_up_round1_estimate']:,}",
                  f"  one client's local training: {d['seconds_one_client']:.2f}s; estimated "
                  f"{d['seconds_per_round_estimate']:.1f}s per round of training",
                  f"  one client's evaluation: {d['seconds_one_client_eval']:.2f}s; estimated "
                  f"{d['seconds_per_evaluation_estimate']:.1f}s per evaluation of all clients, "
                  f"{d['evaluations']} evaluations",
                  f"  estimated {d['seconds_run_estimate'] / 60:.1f} min for the run (training and evaluation)"]
    return "\n".join(lines)
