"""``fedblend deploy CONFIG.toml --nodes N --out DIR``: the run on a loopback Flower federation, a SuperLink and
N SuperNodes on this machine (:mod:`fedblend.flower.deploy`; ``--write-app``: only the Flower app)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.flags import float_in, int_in
from fedblend.common.errors import ConfigError
from fedblend.rundir import DirLock

RESULT_KEYS = ["method", "seed", "rounds", "best_accuracy", "final_accuracy", "seconds_per_round"]


def add_parser(sub) -> None:
    dep = sub.add_parser("deploy", help="run CONFIG on Flower: a SuperLink and N SuperNodes on loopback "
                                        "(needs pip install 'fedblend[flower]'; see docs/deploy.md)")
    cli_args.common(dep)
    dep.add_argument("--nodes", type=int_in(flags.NODES), default=2, help="SuperNodes to start (default 2; at most "
                     "the run's clients)")
    dep.add_argument("--timeout", type=float_in(flags.TIMEOUT), default=600.0, help="seconds to wait for a node's "
                     "answer (default 600)")
    dep.add_argument("--min-clients", type=int_in(flags.MIN_CLIENTS), default=1, help="fewer answers in an exchange "
                     "stop the run")
    dep.add_argument("--retries", type=int_in(flags.RETRIES), default=1, help="send a message again when its reply is "
                     "a transient Flower error, e.g. a ClientApp that stopped responding (default 1; 0: never)")
    dep.add_argument("--threads", type=int_in(flags.THREADS), default=1, help="torch threads per process (default 1)")
    dep.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    dep.add_argument("--force", action="store_true", help="replace a run already in OUT")
    dep.add_argument("--quiet", action="store_true", help="no progress display")
    dep.add_argument("--keep-work", action="store_true", help="keep the nodes' states and the SuperLink's database "
                     "in the work folder .OUT.flower after a run that did all its rounds (to extend it later with "
                     "--resume); by default only its logs stay")
    dep.add_argument("--write-app", metavar="APP_DIR", help="only write the Flower app (for `flwr run APP_DIR "
                     "CONNECTION` against your own SuperLink; OUT is then a path on the SuperLink's machine)")


def command(args: argparse.Namespace) -> int:
    """``fedblend deploy``: the run on a loopback Flower federation (fedblend.flower.deploy)."""
    cfg = cli_args.run_config(args)
    try:
        from fedblend.flower.deploy import deploy_local
    except ImportError as exc:
        raise ConfigError(f"fedblend deploy needs Flower: pip install 'fedblend[flower]' ({exc})") from exc
    if not args.out:
        raise ConfigError("deploy needs --out DIR (the results directory)")
    cli_args.refuse_resume_and_force(args)
    if args.nodes > cfg.partition.num_clients:
        raise ConfigError(f"--nodes {args.nodes} is more than the run's {cfg.partition.num_clients} clients "
                          f"(partition.num_clients): a node would hold no client")
    if args.write_app:
        return _write_app(cfg, args)
    from fedblend.progress import Progress

    progress = None if getattr(args, "quiet", False) else Progress(cfg.rounds, f"flower {cfg.label}")
    try:
        summary = deploy_local(cfg, args.out, args.nodes, args.data_dir, timeout=args.timeout,
                               min_clients=args.min_clients, threads=args.threads, resume=args.resume,
                               force=args.force, progress=progress, retries=args.retries,
                               keep_work=args.keep_work)
    finally:
        if progress is not None:
            progress.close()
    from fedblend.flower.deploy import work_dir, work_note

    print(work_note(work_dir(Path(args.out))), file=sys.stderr)
    cli_args.result_line(summary, RESULT_KEYS)
    print(f"results in {args.out}")
    return 0


def _write_app(cfg, args: argparse.Namespace) -> int:
    """``--write-app APP_DIR``: only the Flower app, for ``flwr run`` against the user's own SuperLink."""
    from fedblend.flower.deploy import write_app

    with DirLock(args.write_app, "Flower app folder"):
        app = write_app(cfg, args.write_app, args.out, args.data_dir, args.nodes, args.timeout, args.min_clients,
                        args.threads, args.resume, args.force, retries=args.retries)
    print(f"wrote the Flower app {app}; run it with: flwr run {app} CONNECTION --stream")
    return 0
