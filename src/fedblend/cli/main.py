"""The ``fedblend`` command.

* ``fedblend run CONFIG.toml [--set key=value ...] [--out DIR] [--data-dir DIR] [--resume | --force]``
* ``fedblend report RUN_DIR_OR_FOLDER ... [--out DIR]``
* ``fedblend partition CONFIG.toml [--set ...] [--out DIR]``  (class-count table + PNG, no training)
* ``fedblend methods``  (registered methods and transforms with their options)
* ``fedblend bench CONFIG.toml [--rounds N] [--backend ...]``  (engine vs a plain loop over the same work)
* ``fedblend pretrain CONFIG.toml --out agent.pt [--set ...]``  (pFedRLLA's agent + embedding network, App. D)
* ``fedblend sweep CONFIG... [--seeds 0 1 2] [--grid K=V1,V2 ...] [--set ...] [--jobs N] --out DIR``  (configs x
  grid x seeds, N at a time; finished runs skipped, killed ones resumed; then the report table)
* ``fedblend report RUNS... --compare A B``  (paired per-seed differences A - B with a t-interval)
* ``fedblend report RUNS... --diagnostics``  (each run's method diagnostics: FedAPA's weights, ALA's, ...)
* ``fedblend configs``, ``fedblend methods NAME``, ``fedblend export tensorboard RUN_DIR``, ``fedblend --version``
* ``fedblend run ... --dry-run`` (``--check``: the same checks, no timing), ``fedblend partition ... --export pflib DIR``
* ``fedblend deploy CONFIG.toml --nodes N --out DIR``  (the run on a loopback Flower SuperLink + N SuperNodes)

Every expected failure ends in one line ``fedblend: error: ...`` on stderr and a non-zero exit: 2 for bad
input (config, flags, usage, an existing run without --resume / --force, a directory another fedblend process is
writing, a refused resume, a user's file that cannot be used: a partition, a PFLlib folder, an agent file, a run's
metrics or summary), 1 for faults (missing or corrupt data, checkpoint, a full disk, a client worker that died, a
run that diverged, a plug-in whose code raised: the line names the plug-in, the hook, the client and the round),
130 for Ctrl-C (the line says how to resume). The line names the file or resource and what to do. ``--debug``
shows the traceback instead. When the reader of the output goes away (``fedblend methods | head``) the command
stops without a line, with 141 as a tool killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from fedblend.cli import bench, configs, deploy, exits, export, methods, partition, pretrain, report, run, sweep
from fedblend.cli.args import Parser, config_overrides  # noqa: F401 - config_overrides: imported from here by tests
from fedblend.cli.methods import field_help  # noqa: F401 - imported from here by users' scripts and tests
from fedblend.common.errors import FedblendError, RunInterrupted
from fedblend.rundir import die_with_parent

#: one module per command, in the order ``fedblend --help`` lists them: each has ``add_parser(subparsers)`` and
#: ``command(args) -> exit code``
COMMANDS = {"run": run, "report": report, "partition": partition, "methods": methods, "configs": configs,
            "sweep": sweep, "export": export, "bench": bench, "pretrain": pretrain, "deploy": deploy}


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog="fedblend", description=__doc__.replace("``", ""),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"fedblend {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    exits.setup_logging(logging.DEBUG if debug else logging.WARNING if "--quiet" in argv else logging.INFO)
    exits.sigterm_interrupts()
    die_with_parent()  # a run started by `fedblend sweep` stops when the sweep dies, even by kill -9
    try:
        with warnings.catch_warnings():
            warnings.showwarning = exits.show_warning
            return _dispatch(parser().parse_args(argv))
    except (FedblendError, OSError, RunInterrupted, RuntimeError, KeyboardInterrupt) as exc:
        code = exits.failure_code(exc, debug)
        if code is None:
            raise
        return code


def _dispatch(args: argparse.Namespace) -> int:
    return COMMANDS[args.cmd].command(args)


def _version() -> str:
    import fedblend

    return fedblend.__version__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
