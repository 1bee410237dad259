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
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import torch

from fedblend.algorithms import METHODS, TRANSFORMS
from fedblend.cli import flags
from fedblend.cli.flags import float_in, int_in
from fedblend.common.errors import (
    ConfigError,
    FedblendError,
    ResumeMismatchError,
    RunExistsError,
    RunInterrupted,
    UserFileError,
)
from fedblend.common.optional import MissingPackageError
from fedblend.config import SCALAR_RANGES
from fedblend.rundir import DirLock, die_with_parent

SEED_RANGE = SCALAR_RANGES["seed"]
# exit 2; other expected failures exit 1
INPUT_ERRORS = (ConfigError, RunExistsError, ResumeMismatchError, UserFileError)


class UsageError(ConfigError):
    """A malformed command line (unknown flag, a flag's value of the wrong type)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises (one ``fedblend: error:`` line) instead of printing the usage."""

    def error(self, message: str):
        import re

        # a flag's range (fedblend.cli.flags): "argument --threads: must be ..." -> "--threads must be ..."
        message = re.sub(r"^argument (\S+?)(?:/\S+)?: must be", r"\1 must be", message)
        raise UsageError(f"{message} (see {self.prog} --help)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (optional: flags / --set alone also work)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rounds=5 --set partition.alpha=0.5")
    p.add_argument("--data-dir", help="dataset directory (default: $FEDBLEND_DATA or ~/.fedblend/data)")
    p.add_argument("--out", help="output directory")
    _debug(p)


def _debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")


def backend_list(text: str) -> list[str]:
    """``--backends``: distinct names of local backends, comma-separated."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ("sequential", "processes", "vmap")]
    if not names or bad or len(set(names)) != len(names):
        raise UsageError(f"--backends must name distinct backends among sequential, processes, vmap, "
                         f"comma-separated; got {text!r} (see fedblend bench --help)")
    return names


def _runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], help="where tensors live (config: device)")
    p.add_argument("--backend", choices=["sequential", "processes", "vmap", "flower-sim"],
                   help="how client halves run (config: backend): worker 'processes', 'vmap' (batched clients), or "
                        "'flower-sim' (Flower's Simulation Engine, --workers Ray actors; RAY_ADDRESS: a Ray cluster)")
    p.add_argument("--workers", type=int_in(flags.WORKERS), help="worker processes of --backend processes (config: "
                   "workers; capped at the clients and the CPU cores), Ray actors of --backend flower-sim")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fedblend", description=__doc__.replace("``", ""),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"fedblend {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one experiment")
    _common(run)
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
    _runtime_flags(run)
    rep = sub.add_parser("report", help="table (mean ± std over seeds) and accuracy curves of runs")
    rep.add_argument("runs", nargs="+", help="run directories or folders containing them")
    rep.add_argument("--out", help="write table.md / .csv / .tex / .json and PNG curves here")
    rep.add_argument("--no-plots", action="store_true")
    rep.add_argument("--compare", nargs=2, metavar=("A", "B"), help="paired per-seed differences A - B with a "
                     "t-interval; A and B name groups (label, method, part of a label, or label@hash)")
    rep.add_argument("--band", choices=["std", "ci"], default="std", help="the curves' band: sample std over seeds "
                     "(default, as the table) or the 95%% t-interval of the mean")
    rep.add_argument("--acc-range", nargs=2, type=float_in(flags.ACC_RANGE), metavar=("LOW", "HIGH"), help="zoom the curves' "
                     "accuracy axis to LOW-HIGH %% (e.g. 95 100 where the rows end close together; the loss axis "
                     "stays whole)")
    rep.add_argument("--diagnostics", action="store_true", help="each run's method diagnostics (FedAPA's "
                     "aggregation weights, ALA's learned weights, ...): printed, drawn into OUT/diagnostics with --out")
    _debug(rep)
    part = sub.add_parser("partition", help="build and show a partition without training")
    _common(part)
    part.add_argument("--export", nargs=2, metavar=("FORMAT", "DIR"), help="write the partition in a peer's format: "
                      "pflib (train/{k}.npz, test/{k}.npz, config.json) into an empty folder or over an earlier "
                      "PFLlib export (replaced whole)")
    part.add_argument("--force", action="store_true", help="--out may be a run directory: the run there is "
                      "removed first (its partition would no longer match its checkpoint)")
    meth = sub.add_parser("methods", help="list methods, transforms and their options; with NAME, its options "
                                          "with defaults, allowed values and help")
    meth.add_argument("name", nargs="?", help="a method or transform (e.g. fedapa, ala)")
    _debug(meth)
    cfgs = sub.add_parser("configs", help="list the bundled configs with their one-line descriptions")
    cfgs.add_argument("filter", nargs="?", help="only configs whose path contains this")
    _debug(cfgs)
    sw = sub.add_parser("sweep", help="run configs x grid x seeds, N at a time, restartable; then the report")
    sw.add_argument("configs", nargs="+", help="TOML config files")
    sw.add_argument("--seeds", nargs="+", type=int_in(SEED_RANGE), help="seeds (default: each config's seed; "
                    "then no --grid or --set may set the seed)")
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                    help="a field and its values; several --grid give their product")
    sw.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field in every run, e.g. --set rounds=2")
    sw.add_argument("--jobs", type=int_in(flags.JOBS), default=1, help="runs at a time (default 1; capped at the "
                    "CPU cores)")
    sw.add_argument("--threads", type=int_in(flags.THREADS), default=1, help="torch CPU threads per run (default 1)")
    sw.add_argument("--out", required=True, help="sweep folder: OUT/<config>[__grid]/seed<S>, report in OUT/report")
    sw.add_argument("--data-dir", help="dataset directory (default: $FEDBLEND_DATA or ~/.fedblend/data)")
    sw.add_argument("--no-plots", action="store_true", help="no report curves")
    sw.add_argument("--dry-run", action="store_true", help="print what each run would do (start, resume, "
                    "restart, skip) and stop")
    _debug(sw)
    ex = sub.add_parser("export", help="export a finished run to a tracker: tensorboard, mlflow, wandb (offline); "
                                       "exporting again replaces the earlier export")
    ex.add_argument("format", choices=["tensorboard", "mlflow", "wandb"])
    ex.add_argument("run_dir", help="a run directory (holding metrics.jsonl)")
    ex.add_argument("--out", help="where to write (default RUN_DIR/tensorboard, RUN_DIR/mlruns, RUN_DIR/wandb)")
    _debug(ex)
    b = sub.add_parser("bench", help="time engine rounds against a plain PyTorch loop over the same work")
    _common(b)
    b.add_argument("--rounds", type=int_in(flags.BENCH_ROUNDS), default=3, help="rounds to time (default 3)")
    b.add_argument("--threads", type=int_in(flags.THREADS), default=None, help="torch CPU threads (default: torch's)")
    b.add_argument("--backends", default=None, help="comma-separated backends to time against "
                   "each other on the same rounds, interleaved (e.g. sequential,vmap), instead of the plain loop")
    _runtime_flags(b)
    pre = sub.add_parser("pretrain", help="pre-train pFedRLLA's agent and embedding network (paper App. D): "
                                          "run CONFIG with the body kept local, write the agent file to --out")
    _common(pre)
    pre.add_argument("--threads", type=int_in(flags.THREADS), default=1, help="torch CPU threads (default 1, as run)")
    pre.add_argument("--quiet", action="store_true", help="no progress display")
    pre.add_argument("--resume", action="store_true", help="continue an interrupted pre-training run from "
                     "OUT.run/checkpoint.pt (same config; checkpoints every checkpoint_every rounds), then write OUT")
    pre.add_argument("--force", action="store_true", help="replace an earlier pre-training run in OUT.run")
    dep = sub.add_parser("deploy", help="run CONFIG on Flower: a SuperLink and N SuperNodes on loopback "
                                        "(needs pip install 'fedblend[flower]'; see docs/deploy.md)")
    _common(dep)
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
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    _setup_logging(logging.DEBUG if debug else logging.WARNING if "--quiet" in argv else logging.INFO)
    _sigterm_interrupts()
    die_with_parent()  # a run started by `fedblend sweep` stops when the sweep dies, even by kill -9
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _dispatch(parser().parse_args(argv))
    except (FedblendError, OSError, RunInterrupted) as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 128 + signal.SIGPIPE
        if debug:
            raise
        print(f"fedblend: error: {_one_line(exc)}", file=sys.stderr)
        return 130 if isinstance(exc, RunInterrupted) else 2 if isinstance(exc, INPUT_ERRORS) else 1
    except RuntimeError as exc:  # torch reports a failed file write / read (a full disk) as a RuntimeError
        if debug or not _torch_io_error(exc):
            raise
        print(f"fedblend: error: a file could not be written or read ({_one_line(exc)}); the disk may be full: free "
              f"space, then run again (a run continues from its last checkpoint with --resume)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # outside a run (loading data, building a partition)
        if debug:
            raise
        print("fedblend: error: interrupted", file=sys.stderr)
        return 130


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (``| head`` has read what it wanted): the one broken
    pipe that is not a fault. A broken pipe to a client worker or a socket is one, and is reported."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


class _StderrHandler(logging.Handler):
    """Writes records to the current ``sys.stderr`` (looked up at each record, so a replaced stderr is honoured)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _setup_logging(level: int) -> None:
    """The library logs through ``logging.getLogger("fedblend...")`` (what a deployment does, resumes, faults a
    Flower backend noticed); the command shows INFO and above on stderr as ``fedblend: message`` (``--quiet``:
    warnings only, ``--debug``: everything). A program using the library configures logging itself."""
    log = logging.getLogger("fedblend")
    log.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("fedblend: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def _sigterm_interrupts() -> None:
    """SIGTERM (a scheduler, ``kill``, ``fedblend sweep`` stopping its runs) stops a command as Ctrl-C does: a run
    keeps its last checkpoint and exits 130 saying how to resume. SIGINT alone cannot do this for runs started in
    the background, where the shell starts them with SIGINT ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum, frame):
    # once: a run stopping at its checkpoint is not interrupted again by a repeated SIGTERM (the kernel's parent-
    # death signal can arrive once per exiting thread of a killed sweep)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _one_line(exc: BaseException) -> str:
    text = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, FedblendError):
        from fedblend.common.files import hint

        text += f" ({hint(exc.errno)})" if hint(exc.errno) else ""
    return " ".join(text.split()) or type(exc).__name__


def _torch_io_error(exc: RuntimeError) -> bool:
    """Whether a RuntimeError is torch's report of a failed file write or read (its errno is lost)."""
    text = str(exc)
    return any(s in text for s in ("PytorchStreamWriter", "PytorchStreamReader", "file write failed",
                                   "inline_container", "unexpected pos"))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"fedblend: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _version() -> str:
    import fedblend

    return fedblend.__version__


def _dispatch(args: argparse.Namespace) -> int:
    from fedblend.config import load_config

    extra = _dispatch_workflow(args)
    if extra is not None:
        return extra
    if args.cmd == "methods":
        from fedblend.algorithms.registry import load_all_plugins

        failed = load_all_plugins()  # installed packages' entry points (fedblend.methods / fedblend.transforms)
        for name, cls in sorted(METHODS.items()):
            opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
            print(f"{name:12s} {opts}  -- {cls.paper}{_plugin_note(cls)}")
        for name, cls in sorted(TRANSFORMS.items()):
            opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
            print(f"+{name:11s} {opts}{_plugin_note(cls)}")
        for what, err in failed.items():
            print(f"fedblend: warning: {what} cannot be used: {err}", file=sys.stderr)
        return 0
    if args.cmd == "report":
        from fedblend.cli.report import run_report

        return run_report(args)
    cfg = load_config(args.config, config_overrides(args))
    if args.cmd == "bench":
        from fedblend.bench import bench

        if args.threads:
            torch.set_num_threads(args.threads)
        if args.backends is not None:
            from fedblend.bench import compare_backends

            backends = backend_list(args.backends)
            print(json.dumps(compare_backends(cfg, backends, args.rounds, args.data_dir), indent=2))
            return 0
        print(json.dumps(bench(cfg, args.rounds, args.data_dir), indent=2))
        return 0
    if args.cmd == "pretrain":
        return _pretrain(cfg, args)
    if args.cmd == "deploy":
        return _deploy(cfg, args)
    if args.cmd == "partition":
        from fedblend.experiment import build_data
        from fedblend.results.partition import plot_counts

        fed = build_data(cfg, args.data_dir)
        print(fed.table())
        if args.out:
            out = Path(args.out)
            with DirLock(out, "partition folder"):
                _refuse_run_in(out, args.force)
                fed.save(out / "partition.json")
                (out / "partition.txt").write_text(fed.table() + "\n")
                try:
                    plot_counts(fed, out / "partition.png")
                    png = ", partition.png"
                except MissingPackageError as exc:  # the partition is written; its picture is what is missing
                    warnings.warn(f"no partition.png: {exc}", RuntimeWarning, stacklevel=1)
                    png = ""
            print(f"wrote {out}/partition.json, partition.txt{png}")
        if args.export:
            _export_partition(cfg, fed, args)
        return 0
    from fedblend.experiment import default_out_dir, run_experiment
    from fedblend.progress import Progress

    if args.resume and args.force:
        raise ConfigError("--resume continues the run in OUT and --force replaces it: give one of them")
    if args.allow_code_change and not args.resume:
        raise ConfigError("--allow-code-change applies to --resume only (a new run records the code it runs)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.out:
        out = Path(args.out)
    else:  # a new run never lands on an earlier one; --resume continues the first
        out = Path("runs") / f"{cfg.label}-seed{cfg.seed}" if args.resume else default_out_dir(cfg)
    if args.dry_run or args.check:
        from fedblend.experiment import dry_run
        from fedblend.rundir import check_out_dir

        if args.check:
            check_out_dir(out, args.resume, args.force)
        print(_dry_run_text(dry_run(cfg, args.data_dir, time_client=not args.check)))
        return 0
    progress = None if args.quiet else Progress(cfg.rounds, cfg.label)
    try:
        if cfg.backend == "flower-sim":  # Flower's Simulation Engine drives the same run (docs/deploy.md)
            try:
                from fedblend.flower.sim import simulate
            except ImportError as exc:
                raise ConfigError(f"--backend flower-sim needs Flower and Ray: pip install 'fedblend[simulation]' "
                                  f"({exc})") from exc
            summary = simulate(cfg, out, args.data_dir, resume=args.resume, force=args.force, progress=progress)
        else:
            summary = run_experiment(cfg, out, args.data_dir, resume=args.resume, progress=progress,
                                     force=args.force, allow_code_change=args.allow_code_change)
    finally:
        if hasattr(progress, "close"):  # any callable may stand in for the display (tests do)
            progress.close()
    _result_line(summary, ["method", "seed", "rounds", "best_accuracy", "final_accuracy", "global_accuracy",
                           "seconds_per_round"])
    print(f"results in {out}")
    return 0


def _result_line(summary: dict, keys: list[str]) -> None:
    """The command's one JSON result line; a run that is not a full result (status other than "finished", e.g.
    "finished-degraded": clients lost) carries its status there and says why on stderr."""
    status = summary.get("status", "finished")
    shown = {**({"status": status} if status != "finished" else {}), **{k: summary.get(k) for k in keys if k in summary}}
    print(json.dumps(shown))
    if status != "finished":
        print(f"fedblend: warning: the run's status is {status!r}: {summary.get('degraded') or summary.get('stop_reason', '')}",
              file=sys.stderr)


def config_overrides(args: argparse.Namespace) -> list[str]:
    """The command line's config overrides: its ``--set`` values, then ``--device`` / ``--backend`` / ``--workers``
    (each the config field of its name)."""
    overrides = list(args.overrides)
    for flag in ("device", "backend", "workers"):
        if getattr(args, flag, None) is not None:
            overrides.append(f"{flag}={getattr(args, flag)!r}" if flag != "workers" else f"workers={args.workers}")
    return overrides


def _refuse_run_in(out: Path, force: bool) -> None:
    """``partition --out``: a directory holding a run (more than an earlier partition's files) is refused, or with
    ``force`` cleared: the run's checkpoint would otherwise continue on a partition it was not trained on."""
    from fedblend.rundir import clear_run, holds_run

    run_files = [f for f in holds_run(out) if f not in ("partition.json", "partition.txt")]
    if run_files and not force:
        raise RunExistsError(f"{out} holds a run ({', '.join(run_files)}); a new partition.json would not match its "
                             f"checkpoint and config: use another --out, or --force to delete that run first")
    if run_files:
        clear_run(out)


def _pretrain(cfg, args: argparse.Namespace) -> int:
    """Run ``cfg`` as its method's pre-training run (its results directory is ``OUT.run/``), then write what it
    learned to ``OUT`` (pFedRLLA: the agent file that ``options.agent`` loads)."""
    from fedblend.algorithms.registry import METHODS, parse_method
    from fedblend.common.options import ConfigError
    from fedblend.core.checkpoint import FILENAME, load_checkpoint
    from fedblend.experiment import run_experiment
    from fedblend.progress import Progress

    method = METHODS[parse_method(cfg.method)[0]]  # the class: its declaration (no option changes it)
    if not method.pretrainable:
        able = " or ".join(f"method = {n!r}" for n, c in sorted(METHODS.items()) if c.pretrainable)
        raise ConfigError(f"pretrain needs a method with a pre-training run ({able}), got {cfg.method!r}")
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


# ------------------------------------------------------------------------------------------------ workflow
def _dispatch_workflow(args: argparse.Namespace) -> int | None:
    """The researcher's-workflow commands (sweep, configs, methods NAME, export); None for the others."""
    if args.cmd == "methods" and args.name:
        print(_method_help(args.name), end="")
        return 0
    if args.cmd == "configs":
        print(_configs_text(args.filter), end="")
        return 0
    if args.cmd == "export":
        from fedblend.tracking import export_run

        print(f"wrote {export_run(args.format, args.run_dir, args.out)}")
        return 0
    if args.cmd == "sweep":
        from fedblend.cli.sweep import plan, sweep

        if args.dry_run:
            runs = plan(args.configs, args.seeds, args.grid, args.overrides, args.out, args.threads, args.data_dir)
            for r in runs:
                print(f"{r.action:8s} {r.out}" + (f"  ({r.why})" if r.why else ""))
            return 0
        with DirLock(args.out, "sweep folder"):  # one sweep per folder; each run also locks its own directory
            runs = plan(args.configs, args.seeds, args.grid, args.overrides, args.out, args.threads, args.data_dir,
                        wait_busy=30.0)
            return sweep(runs, args.jobs, args.out, report_plots=not args.no_plots, echo=_echo)
    return None


def _echo(*a, **k) -> None:
    print(*a, **k, flush=True)


def _method_help(name: str) -> str:
    """A method's or transform's options: default, allowed values and each field's help (its ``help``
    metadata)."""
    import inspect

    from fedblend.algorithms.registry import find_plugin
    from fedblend.common.options import allowed_text

    key = name.lstrip("+")
    cls = METHODS.get(key) or TRANSFORMS.get(key) or find_plugin("method", key) or find_plugin("transform", key)
    if cls is None:
        raise ConfigError(f"no method or transform {name!r}; methods: {', '.join(sorted(METHODS))}; transforms: "
                          f"{', '.join(sorted(TRANSFORMS))} (and plug-ins: fedblend methods lists them)")
    opts = cls.options_cls
    helps = field_help(opts)
    where = "options" if key in METHODS else key
    head = f"{key}" + (f" -- {cls.paper}" if getattr(cls, "paper", None) else "") + _plugin_note(cls)
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "").split("\n\n")[0]
    lines = [head, *(["", doc] if doc else []), "", f"[{where}] table (in the config, or --set {where}.NAME=VALUE):"]
    for f in dataclasses.fields(opts):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        lines.append(f"  {f.name} = {default!r}    ({allowed_text(opts, f.name)})")
        if helps.get(f.name):
            lines += [f"      {ln}" for ln in textwrap.wrap(helps[f.name], 100)]
    if not dataclasses.fields(opts):
        lines.append("  (none)")
    if key in METHODS:  # which of its models a run evaluates: [eval] model (the first is the default)
        from fedblend.algorithms.registry import build_method

        lines += ["", "[eval] model (which model the personalized accuracy scores; the first is the default):"]
        for choice, what in build_method(key).eval_choices().items():
            lines += [f"  {choice!r}"] + [f"      {ln}" for ln in textwrap.wrap(what, 100)]
    return "\n".join(lines).replace("`", "") + "\n"


def _plugin_note(cls: type) -> str:
    """`` [plug-in: module]`` for a method or transform that is not part of fedblend."""
    mod = getattr(cls, "__module__", "")
    return "" if mod.startswith("fedblend.") else f"  [plug-in: {mod}]"


def field_help(cls: type) -> dict[str, str]:
    """``{field: help}`` of an options dataclass, from each field's ``metadata["help"]`` (written with
    :func:`fedblend.common.options.opt` or ``dataclasses.field(metadata={"help": ...})``); fields without one
    are left out."""
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    return {f.name: str(f.metadata["help"]) for f in fields if f.metadata.get("help")}


def _configs_root() -> Path:
    """The bundled ``configs/`` folder (the repository's, beside ``src/``), else ``./configs``."""
    here = Path(__file__).resolve().parents[3] / "configs"
    return here if here.is_dir() else Path("configs")


def _configs_text(pattern: str | None) -> str:
    root = _configs_root()
    paths = sorted(root.rglob("*.toml"))
    if pattern:
        paths = [p for p in paths if pattern in str(p.relative_to(root))]
    if not paths:
        return f"no configs under {root}" + (f" matching {pattern!r}" if pattern else "") + "\n"
    rows = [(str(p.relative_to(root.parent)), config_description(p)) for p in paths]
    width = max(len(r[0]) for r in rows)
    return "".join(f"{path:{width}s}  {desc}\n" for path, desc in rows)


def config_description(path: Path) -> str:
    """What a config runs, from its fields: ``FedAPA (mu=0.3): FMNIST, Dir(0.1), 20 clients, LeNet-5; 50 rounds``
    (the method with the options that differ from its defaults, the setting, the rounds)."""
    from fedblend.config import RunConfig, load_config
    from fedblend.results.names import method_name, setting_text

    try:
        cfg = load_config(path)
    except FedblendError as exc:
        return f"(does not load: {_one_line(exc)})"
    resolved = cfg.resolved()
    defaults = RunConfig(method=cfg.method).resolved()  # the method's and transforms' default options
    changed = {k: v for k, v in resolved["options"].items() if defaults["options"].get(k) != v}
    for t in cfg.transforms:
        changed.update({f"{t}.{k}": v for k, v in resolved[t].items() if defaults[t].get(k) != v})
    opts = ", ".join(f"{k}={v}" for k, v in list(changed.items())[:3]) + (", ..." if len(changed) > 3 else "")
    return (f"{method_name(cfg.method)}{f' ({opts})' if opts else ''}: {setting_text(resolved)}; "
            f"{cfg.rounds} rounds")


def _dry_run_text(d: dict) -> str:
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


def _export_partition(cfg, fed, args: argparse.Namespace) -> None:
    from fedblend.data.interop import export_pflib
    from fedblend.data.sources import load_dataset

    fmt, target = args.export
    if fmt != "pflib":
        raise ConfigError(f"--export: unknown format {fmt!r}; known: pflib")
    raw = load_dataset(cfg.dataset, args.data_dir)
    meta = {"partition": cfg.partition.kind, "alpha": cfg.partition.alpha, "batch_size": cfg.train.batch_size,
            "balance": cfg.partition.balanced, "fedblend_split": cfg.partition.split, "fedblend_seed": cfg.seed}
    if "val" in fed.indices:  # refused by export_pflib too; here before the folder is touched
        from fedblend.data.partition import PartitionError

        raise PartitionError("PFLlib's layout has train and test only; export a partition without validation "
                             "data (partition.split = 'merge' or 'official')")
    with DirLock(target, "export folder"):
        _clear_pflib_export(Path(target))
        export_pflib(raw, fed.indices, cfg.partition.split, target, meta)
    print(f"wrote {target}/train/*.npz, test/*.npz, config.json (PFLlib layout, {fed.num_clients} clients)")
def _clear_pflib_export(target: Path) -> None:
    """``--export pflib DIR`` writes into an empty folder or over an earlier PFLlib export, which is removed
    whole first (``train/``, ``test/``, ``config.json``: no client of a larger earlier export is left behind to
    be read back); a folder holding anything else is refused."""
    from fedblend.rundir import LOCK_NAME

    entries = sorted(e for e in os.listdir(target) if e != LOCK_NAME)
    layout = {"train", "test", "config.json"}
    earlier = bool(entries) and set(entries) <= layout and all(
        (target / d).is_dir() and not (target / d).is_symlink()
        and all(f.endswith(".npz") and (target / d / f).is_file() for f in os.listdir(target / d))
        for d in ("train", "test") if d in entries) and not (target / "config.json").is_dir()
    if entries and not earlier:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ConfigError(f"--export pflib {target}: the folder holds files that are not a PFLlib export ({shown}); "
                          f"export into an empty or new folder")
    for e in entries:
        p = target / e
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def _deploy(cfg, args: argparse.Namespace) -> int:
    """``fedblend deploy``: the run on a loopback Flower federation (fedblend.flower.deploy)."""
    try:
        from fedblend.flower.deploy import deploy_local
    except ImportError as exc:
        raise ConfigError(f"fedblend deploy needs Flower: pip install 'fedblend[flower]' ({exc})") from exc
    from fedblend.flower.deploy import write_app

    if not args.out:
        raise ConfigError("deploy needs --out DIR (the results directory)")
    if args.resume and args.force:
        raise ConfigError("--resume continues the run in OUT and --force replaces it: give one of them")
    if args.nodes > cfg.partition.num_clients:
        raise ConfigError(f"--nodes {args.nodes} is more than the run's {cfg.partition.num_clients} clients "
                          f"(partition.num_clients): a node would hold no client")
    if args.write_app:
        with DirLock(args.write_app, "Flower app folder"):
            app = write_app(cfg, args.write_app, args.out, args.data_dir, args.nodes, args.timeout, args.min_clients,
                            args.threads, args.resume, args.force, retries=args.retries)
        print(f"wrote the Flower app {app}; run it with: flwr run {app} CONNECTION --stream")
        return 0
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
    _result_line(summary, ["method", "seed", "rounds", "best_accuracy", "final_accuracy", "seconds_per_round"])
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
