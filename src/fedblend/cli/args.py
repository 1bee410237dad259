"""What the commands' parsers share: the parser class whose usage errors raise, the flags several commands take
(config, ``--set``, ``--data-dir``, ``--out``, ``--debug``; the runtime flags), and the run config a command line
asks for (its file with its ``--set`` values and runtime flags applied)."""

from __future__ import annotations

import argparse
import json
import sys

from fedblend.cli import flags
from fedblend.cli.flags import int_in
from fedblend.common.errors import ConfigError


class UsageError(ConfigError):
    """A malformed command line (unknown flag, a flag's value of the wrong type)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises (one ``fedblend: error:`` line) instead of printing the usage."""

    def error(self, message: str):
        import re

        # a flag's range (fedblend.cli.flags): "argument --threads: must be ..." -> "--threads must be ..."
        message = re.sub(r"^argument (\S+?)(?:/\S+)?: must be", r"\1 must be", message)
        raise UsageError(f"{message} (see {self.prog} --help)")


def common(p: argparse.ArgumentParser) -> None:
    """The flags of a command that reads a run config: CONFIG, ``--set``, ``--data-dir``, ``--out``, ``--debug``."""
    p.add_argument("config", nargs="?", help="TOML config file (optional: flags / --set alone also work)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rounds=5 --set partition.alpha=0.5")
    p.add_argument("--data-dir", help="dataset directory (default: $FEDBLEND_DATA or ~/.fedblend/data)")
    p.add_argument("--out", help="output directory")
    debug(p)


def debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")


def runtime_flags(p: argparse.ArgumentParser) -> None:
    """``--device``, ``--backend``, ``--workers``: each sets the config field of its name."""
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], help="where tensors live (config: device)")
    p.add_argument("--backend", choices=["sequential", "processes", "vmap", "flower-sim"],
                   help="how client halves run (config: backend): worker 'processes', 'vmap' (batched clients), or "
                        "'flower-sim' (Flower's Simulation Engine, --workers Ray actors; RAY_ADDRESS: a Ray cluster)")
    p.add_argument("--workers", type=int_in(flags.WORKERS), help="worker processes of --backend processes (config: "
                   "workers; capped at the clients and the CPU cores), Ray actors of --backend flower-sim")


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The command line's config overrides: its ``--set`` values, then ``--device`` / ``--backend`` / ``--workers``
    (each the config field of its name)."""
    overrides = list(args.overrides)
    for flag in ("device", "backend", "workers"):
        if getattr(args, flag, None) is not None:
            overrides.append(f"{flag}={getattr(args, flag)!r}" if flag != "workers" else f"workers={args.workers}")
    return overrides


def run_config(args: argparse.Namespace):
    """The :class:`fedblend.config.RunConfig` the command line asks for: CONFIG (or the defaults) with its
    overrides applied, validated."""
    from fedblend.config import load_config

    return load_config(args.config, config_overrides(args))


def refuse_resume_and_force(args: argparse.Namespace, where: str = "OUT") -> None:
    """``--resume`` and ``--force`` together are a usage error (one continues the run, the other replaces it)."""
    if args.resume and args.force:
        raise ConfigError(f"--resume continues the run in {where} and --force replaces it: give one of them")


def result_line(summary: dict, keys: list[str]) -> None:
    """The command's one JSON result line; a run that is not a full result (status other than "finished", e.g.
    "finished-degraded": clients lost) carries its status there and says why on stderr."""
    status = summary.get("status", "finished")
    shown = {**({"status": status} if status != "finished" else {}), **{k: summary.get(k) for k in keys if k in summary}}
    print(json.dumps(shown))
    if status != "finished":
        print(f"fedblend: warning: the run's status is {status!r}: {summary.get('degraded') or summary.get('stop_reason', '')}",
              file=sys.stderr)
