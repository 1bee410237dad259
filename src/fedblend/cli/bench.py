"""``fedblend bench CONFIG.toml [--rounds N] [--backends a,b]``: engine rounds timed against a plain PyTorch loop
over the same work, or local backends against each other (:mod:`fedblend.bench`)."""

from __future__ import annotations

import argparse
import json

import torch

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.args import UsageError
from fedblend.cli.flags import int_in


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="time engine rounds against a plain PyTorch loop over the same work")
    cli_args.common(b)
    b.add_argument("--rounds", type=int_in(flags.BENCH_ROUNDS), default=3, help="rounds to time (default 3)")
    b.add_argument("--threads", type=int_in(flags.THREADS), default=None, help="torch CPU threads (default: torch's)")
    b.add_argument("--backends", default=None, help="comma-separated backends to time against "
                   "each other on the same rounds, interleaved (e.g. sequential,vmap), instead of the plain loop")
    cli_args.runtime_flags(b)


def command(args: argparse.Namespace) -> int:
    from fedblend.bench import bench, compare_backends

    cfg = cli_args.run_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backends is not None:
        backends = backend_list(args.backends)
        print(json.dumps(compare_backends(cfg, backends, args.rounds, args.data_dir), indent=2))
        return 0
    print(json.dumps(bench(cfg, args.rounds, args.data_dir), indent=2))
    return 0


def backend_list(text: str) -> list[str]:
    """``--backends``: distinct names of local backends, comma-separated."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ("sequential", "processes", "vmap")]
    if not names or bad or len(set(names)) != len(names):
        raise UsageError(f"--backends must name distinct backends among sequential, processes, vmap, "
                         f"comma-separated; got {text!r} (see fedblend bench --help)")
    return names
