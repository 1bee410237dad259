"""The ``fedblend`` command.

* ``fedblend run CONFIG.toml [--set key=value ...] [--out DIR] [--data-dir DIR] [--resume]``
* ``fedblend report RUN_DIR_OR_FOLDER ... [--out DIR]``
* ``fedblend partition CONFIG.toml [--set ...] [--out DIR]``  (class-count table + PNG, no training)
* ``fedblend methods``  (registered methods and transforms with their options)
* ``fedblend pretrain CONFIG.toml --out agent.pt [--set ...]``  (pFedRLLA's agent + embedding network, App. D)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from fedblend.algorithms import METHODS, TRANSFORMS
from fedblend.common.options import ConfigError
from fedblend.data.partition import PartitionError
from fedblend.data.sources import ChecksumError, DataNotFoundError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (optional: flags / --set alone also work)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rounds=5 --set partition.alpha=0.5")
    p.add_argument("--data-dir", help="dataset directory (default: $FEDBLEND_DATA or ~/.fedblend/data)")
    p.add_argument("--out", help="output directory")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fedblend", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one experiment")
    _common(run)
    run.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    run.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--device", choices=["cpu", "cuda", "auto"], help="where tensors live (config: device)")
    run.add_argument("--backend", choices=["sequential", "processes"],
                     help="how client halves run (config: backend); 'processes' = worker processes")
    run.add_argument("--workers", type=int, help="worker processes of --backend processes (config: workers)")
    rep = sub.add_parser("report", help="table (mean ± std over seeds) and accuracy curves of runs")
    rep.add_argument("runs", nargs="+", help="run directories or folders containing them")
    rep.add_argument("--out", help="write table.md, table.json and PNG curves here")
    rep.add_argument("--no-plots", action="store_true")
    part = sub.add_parser("partition", help="build and show a partition without training")
    _common(part)
    sub.add_parser("methods", help="list methods, transforms and their options")
    pre = sub.add_parser("pretrain", help="pre-train pFedRLLA's agent and embedding network (paper App. D): "
                                          "run CONFIG with the body kept local, write the agent file to --out")
    _common(pre)
    pre.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    pre.add_argument("--quiet", action="store_true", help="no progress display")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, PartitionError, DataNotFoundError, ChecksumError, FileNotFoundError) as exc:
        print(f"fedblend: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from fedblend.config import load_config

    if args.cmd == "methods":
        for name, cls in sorted(METHODS.items()):
            opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
            print(f"{name:12s} {opts}  -- {cls.paper}")
        for name, cls in sorted(TRANSFORMS.items()):
            opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
            print(f"+{name:11s} {opts}")
        return 0
    if args.cmd == "report":
        from fedblend.cli.report import report

        print(report(args.runs, args.out, plots=not args.no_plots), end="")
        return 0
    overrides = list(args.overrides)
    for flag in ("device", "backend", "workers"):
        if getattr(args, flag, None) is not None:
            overrides.append(f"{flag}={getattr(args, flag)!r}" if flag != "workers" else f"workers={args.workers}")
    cfg = load_config(args.config, overrides)
    if args.cmd == "pretrain":
        return _pretrain(cfg, args)
    if args.cmd == "partition":
        from fedblend.data.federated import plot_counts
        from fedblend.experiment import build_data

        fed = build_data(cfg, args.data_dir)
        print(fed.table())
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            fed.save(out / "partition.json")
            (out / "partition.txt").write_text(fed.table() + "\n")
            plot_counts(fed, out / "partition.png")
            print(f"wrote {out}/partition.json, partition.txt, partition.png")
        return 0
    from fedblend.experiment import Progress, run_experiment

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out or Path("runs") / f"{cfg.label}-seed{cfg.seed}")
    progress = None if args.quiet else Progress(cfg.rounds, cfg.label)
    summary = run_experiment(cfg, out, args.data_dir, resume=args.resume, progress=progress)
    keys = ["method", "seed", "rounds", "best_accuracy", "final_accuracy", "global_accuracy", "seconds_per_round"]
    print(json.dumps({k: summary.get(k) for k in keys if k in summary}))
    print(f"results in {out}")
    return 0


def _pretrain(cfg, args: argparse.Namespace) -> int:
    """Run ``cfg`` as a pFedRLLA pre-training run (its results directory is ``OUT.run/``), then write the
    agent file ``OUT`` that ``options.agent`` loads."""
    from fedblend.algorithms.pfedrlla import pretrain_options, save_agent
    from fedblend.common.options import ConfigError
    from fedblend.core.checkpoint import FILENAME, load_checkpoint
    from fedblend.experiment import Progress, run_experiment

    if cfg.method != "pfedrlla":
        raise ConfigError(f"pretrain needs method = 'pfedrlla', got {cfg.method!r}")
    if not args.out:
        raise ConfigError("pretrain needs --out AGENT_FILE")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg.options = pretrain_options(cfg.options)
    cfg.checkpoint_every = cfg.rounds
    out = Path(args.out)
    run_dir = out.with_name(out.name + ".run")
    progress = None if args.quiet else Progress(cfg.rounds, f"pretrain {cfg.label}")
    run_experiment(cfg, run_dir, args.data_dir, progress=progress)
    save_agent(load_checkpoint(run_dir / FILENAME)["server"], out)
    print(f"agent file {out} (pre-training run in {run_dir})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
