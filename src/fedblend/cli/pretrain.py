"""``fedblend pretrain CONFIG.toml --out agent.pt``: a method's pre-training run (pFedRLLA's agent and embedding
network, paper App. D) in ``OUT.run/``, then what it learned written to ``OUT``."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.flags import int_in
from fedblend.common.errors import ConfigError
from fedblend.rundir import DirLock


def add_parser(sub) -> None:
    pre = sub.add_parser("pretrain", help="pre-train pFedRLLA's agent and embedding network (paper App. D): "
                                          "run CONFIG with the body kept local, write the agent file to --out")
    cli_args.common(pre)
    pre.add_argument("--threads", type=int_in(flags.THREADS), default=1, help="torch CPU threads (default 1, as run)")
    pre.add_argument("--quiet", action="store_true", help="no progress display")
    pre.add_argument("--resume", action="store_true", help="continue an interrupted pre-training run from "
                     "OUT.run/checkpoint.pt (same config; checkpoints every checkpoint_every rounds), then write OUT")
    pre.add_argument("--force", action="store_true", help="replace an earlier pre-training run in OUT.run")


def command(args: argparse.Namespace) -> int:
    """Run the config as its method's pre-training run (its results directory is ``OUT.run/``), then write what
    it learned to ``OUT`` (pFedRLLA: the agent file that ``options.agent`` loads)."""
    from fedblend.core.checkpoint import FILENAME, load_checkpoint
    from fedblend.experiment import run_experiment
    from fedblend.progress import Progress

    cfg = cli_args.run_config(args)
    method = _pretrainable(cfg.method)
    if not args.out:
        raise ConfigError("pretrain needs --out AGENT_FILE")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.resume and args.force:
        raise ConfigError("--resume continues the pre-training run in OUT.run and --force replaces it: give one "
                          "of them")
    cfg.options = method.pretrain_options(cfg.options)
    if cfg.checkpoint_every == 0:  # the agent file is read from the last round's checkpoint
        cfg.checkpoint_every = cfg.rounds
    out = Path(args.out)
    if out.is_dir() or out.name in ("", ".", ".."):
        raise ConfigError(f"pretrain --out {args.out} is a directory; give the agent file's path (e.g. agent.pt)")
    run_dir = out.with_name(out.name + ".run")
    progress = None if args.quiet else Progress(cfg.rounds, f"pretrain {cfg.label}")
    again = f"fedblend pretrain {run_dir / 'config.toml'} --out {out}"  # what a Ctrl-C message tells to run
    with DirLock(run_dir, "pre-training run directory"):  # the run, then the agent file from its checkpoint
        run_experiment(cfg, run_dir, args.data_dir, progress=progress, force=args.force, resume=args.resume,
                       command=again)
        method.save_pretrained(load_checkpoint(run_dir / FILENAME)["server"], out)
    print(f"agent file {out} (pre-training run in {run_dir})")
    return 0


def _pretrainable(name: str) -> type:
    """The method class of ``method = name`` (its declaration: no option changes it), which must have a
    pre-training run."""
    from fedblend.algorithms.registry import METHODS, parse_method

    method = METHODS[parse_method(name)[0]]
    if not method.pretrainable:
        able = " or ".join(f"method = {n!r}" for n, c in sorted(METHODS.items()) if c.pretrainable)
        raise ConfigError(f"pretrain needs a method with a pre-training run ({able}), got {name!r}")
    return method
