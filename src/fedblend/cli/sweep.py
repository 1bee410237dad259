"""``fedblend sweep``: the product of configs x grid values x seeds, run N at a time, restartable.

Each run is ``fedblend run CONFIG --set K=V ... --set seed=S --out OUT/<name>/seed<S> --threads T --quiet`` in
its own process (stdout and stderr to ``stdout.log`` in the run directory), where ``<name>`` is the config's
file stem followed by the run's grid values (``t1-fmnist-dir-fedavg__train.lr=0.05``). Before starting, every
run directory is looked at:

* ``summary.json`` of the same config (same config hash): done, skipped;
* ``summary.json`` of another config: refused (the line says so; use another ``--out`` or delete it);
* ``checkpoint.pt``: resumed (``--resume``, results identical to an uninterrupted run);
* run files but no checkpoint (killed before its first checkpoint): started again (``--force``);
* nothing: started;
* locked by a process still writing it (a run of an earlier sweep that is stopping): waited for up to 30 s, then
  ``busy``, not started (the line names the process).

So a killed sweep started again with the same command finishes only the missing runs. One sweep at a time
writes a sweep folder (it holds ``OUT``'s lock, :mod:`fedblend.rundir`; each run holds its own directory's).
The runs die with the sweep: each is started with ``FEDBLEND_PARENT_PID`` and gets SIGTERM from the kernel when
the sweep ends in any way, ``kill -9`` included (it then stops at its last checkpoint, like on Ctrl-C), so no
run goes on writing alone and a restarted sweep resumes it. Ctrl-C (or SIGTERM) interrupts the running
children (each keeps its last checkpoint) and exits 130. After the runs, the ``report`` table of everything
under ``OUT`` is printed and written to ``OUT/report``.

A sweep is refused before anything starts when two of its runs would be the same run (a seed listed twice,
grid values that give the same config) or when ``--seeds`` is given and ``--grid`` / ``--set`` also set
``seed``. ``--jobs`` is capped at the CPU cores.

Exit code: 0 when every run is done; 2 (bad input) when a run was refused or busy (the ``[REFUSED]`` / ``[BUSY]``
lines say why), 1 when a run failed, 130 when interrupted; the largest of them where several apply.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.flags import cap_at_cores, int_in
from fedblend.common.errors import ConfigError
from fedblend.config import SCALAR_RANGES, config_hash, load_config, parse_value
from fedblend.rundir import DirLock, child_env, locked_by, wait_unlocked

RUN_MARKERS = ("config.toml", "metrics.jsonl", "partition.json")


def add_parser(sub) -> None:
    sw = sub.add_parser("sweep", help="run configs x grid x seeds, N at a time, restartable; then the report")
    sw.add_argument("configs", nargs="+", help="TOML config files")
    sw.add_argument("--seeds", nargs="+", type=int_in(SCALAR_RANGES["seed"]), help="seeds (default: each config's seed; "
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
    cli_args.debug(sw)


def command(args) -> int:
    """``fedblend sweep``: the plan (``--dry-run``: printed), then the runs, holding the sweep folder's lock."""
    if args.dry_run:
        runs = plan(args.configs, args.seeds, args.grid, args.overrides, args.out, args.threads, args.data_dir)
        for r in runs:
            print(f"{r.action:8s} {r.out}" + (f"  ({r.why})" if r.why else ""))
        return 0
    with DirLock(args.out, "sweep folder"):  # one sweep per folder; each run also locks its own directory
        runs = plan(args.configs, args.seeds, args.grid, args.overrides, args.out, args.threads, args.data_dir,
                    wait_busy=30.0)
        return sweep(runs, args.jobs, args.out, report_plots=not args.no_plots, echo=_echo)


def _echo(*a, **k) -> None:
    print(*a, **k, flush=True)


@dataclass
class SweepRun:
    """One cell of the sweep: a config file, its grid overrides, a seed and where its results go."""

    config: str
    overrides: list[str]
    seed: int
    out: Path
    name: str
    action: str = "start"  # start | resume | restart | skip | refuse | busy
    why: str = ""
    cmd: list[str] = field(default_factory=list)


def parse_grid(items: list[str]) -> list[list[str]]:
    """``["train.lr=0.01,0.05", "partition.alpha=0.1,1"]`` -> every combination as a list of ``K=V``
    overrides (the first key varies slowest). A value is a TOML value; commas inside brackets or quotes do not
    split (``options.x=[1,2],[3,4]``)."""
    axes = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid expects KEY=V1,V2,..., got {item!r}")
        key, text = item.split("=", 1)
        values = _split_values(text)
        if not values or any(not v for v in values):
            raise ConfigError(f"--grid {item!r}: an empty value")
        axes.append([f"{key.strip()}={v}" for v in values])
    return [list(c) for c in itertools.product(*axes)] if axes else [[]]


def _split_values(text: str) -> list[str]:
    out, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def _tag(overrides: list[str]) -> str:
    safe = "".join(c if c.isalnum() or c in "._=-+," else "_" for c in ",".join(
        f"{o.split('=', 1)[0]}={parse_value(o.split('=', 1)[1])}" for o in overrides))
    return f"__{safe}" if safe else ""


def _sets_seed(item: str) -> bool:
    return item.split("=", 1)[0].strip() == "seed"


def plan(configs: list[str], seeds: list[int] | None, grid: list[str], sets: list[str], out: str | Path,
         threads: int = 1, data_dir: str | None = None, wait_busy: float = 0.0) -> list[SweepRun]:
    """Every run of the sweep with what to do about it (validating each config with its overrides first, so a
    bad grid value fails before anything starts). Refuses a sweep with two identical runs, or with ``seeds``
    and a seed from ``grid`` / ``sets``. A run directory another process is writing is waited for up to
    ``wait_busy`` seconds, then marked ``busy``."""
    if seeds:
        clash = [g for g in [*grid, *sets] if _sets_seed(g)]
        if clash:
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))} and {clash[0]!r} both set the seed; give the seeds "
                              f"with --seeds only")
        dup = sorted({s for s in seeds if seeds.count(s) > 1})
        if dup:
            raise ConfigError(f"--seeds lists seed {dup[0]} more than once; each run would run twice")
    runs = []
    hashes: dict[str, SweepRun] = {}
    for path in configs:
        for cell in parse_grid(grid):
            base = _load(path, [*sets, *cell])
            for seed in (seeds if seeds else [base.seed]):
                cfg = _load(path, [*sets, *cell, f"seed={seed}"])
                name = Path(path).stem + _tag(cell)
                run = SweepRun(path, [*sets, *cell], seed, Path(out) / name / f"seed{seed}", name)
                h = config_hash(cfg.resolved())
                if h in hashes:
                    other = hashes[h]
                    raise ConfigError(f"two sweep runs are the same run (config hash {h}): {other.name} seed "
                                      f"{other.seed} and {name} seed {seed}; remove the duplicate config, grid value "
                                      f"or seed")
                hashes[h] = run
                _decide(run, h, wait_busy, cfg.input_digests())
                run.cmd = [sys.executable, "-m", "fedblend.cli.main", "run", path, "--out", str(run.out), "--quiet",
                           "--threads", str(threads)]
                run.cmd += [x for o in [*run.overrides, f"seed={seed}"] for x in ("--set", o)]
                if data_dir:
                    run.cmd += ["--data-dir", data_dir]
                run.cmd += {"resume": ["--resume"], "restart": ["--force"]}.get(run.action, [])
                runs.append(run)
    names = [r.out for r in runs]
    dup = sorted({str(n) for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"two sweep runs would write to the same directory: {dup[0]} (give configs different "
                          f"file names)")
    return runs


def _load(path: str, overrides: list[str]):
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}{' with ' + ' '.join(overrides) if overrides else ''}: {exc}") from exc


def _decide(run: SweepRun, want_hash: str, wait_busy: float = 0.0, inputs: dict | None = None) -> None:
    pid = wait_unlocked(run.out, wait_busy) if wait_busy > 0 else locked_by(run.out)
    if pid is not None:
        who = f"process {pid}" if pid else "another process"
        run.action, run.why = "busy", (f"{who} is writing {run.out} (a run of an earlier sweep still stopping?); "
                                       f"start the sweep again once it has exited")
        return
    summary = run.out / "summary.json"
    if summary.exists():
        try:
            data = json.loads(summary.read_text())
            have, status = data.get("config_hash"), data.get("status", "finished")
            made_with = (data.get("run") or {}).get("inputs") or {}
        except (OSError, ValueError, AttributeError):
            have, status, made_with = None, None, {}
        changed = [k for k, v in (inputs or {}).items() if k in made_with and made_with[k] != v]
        if have == want_hash and changed:  # the same config, but a file it names holds something else now
            k = changed[0]
            run.action, run.why = "refuse", (f"{run.out} holds a run of this config made with another {k} file "
                                             f"({made_with[k]['path']}: sha256 {made_with[k]['sha256'][:12]}..., "
                                             f"now {inputs[k]['sha256'][:12]}...); delete it or use another --out")
        elif have == want_hash:  # a diverged run is not run again either: same config, same seed, same result
            run.action, run.why = "skip", "finished" if status == "finished" else f"{status}, see its summary.json"
        else:
            run.action, run.why = "refuse", (f"{run.out} holds a finished run of another config (hash {have}, this "
                                             f"one {want_hash}); delete it or use another --out")
    elif (run.out / "checkpoint.pt").exists():
        run.action = "resume"
    elif any((run.out / f).exists() for f in RUN_MARKERS):
        run.action, run.why = "restart", "killed before its first checkpoint"


def _summary_line(run: SweepRun, rc: int, seconds: float) -> str:
    status = "ok" if rc == 0 else f"FAILED rc={rc}"
    extra = ""
    try:
        s = json.loads((run.out / "summary.json").read_text())
        extra = f" best {s['best_accuracy']:.4f} final {s['final_accuracy']:.4f}"
    except (OSError, ValueError, KeyError, TypeError):
        if rc != 0:
            extra = f" (see {run.out / 'stdout.log'})"
    verb = {"resume": " resumed", "restart": " restarted"}.get(run.action, "")
    return f"[{status}] {run.name} seed {run.seed}{verb} {seconds:.0f}s{extra}"


def sweep(runs: list[SweepRun], jobs: int, out: str | Path, report_plots: bool = True, echo=print) -> int:
    """Run the runs that are not done, ``jobs`` at a time; print one line per run and the report table."""
    todo = [r for r in runs if r.action in ("start", "resume", "restart")]
    _announce(runs, echo)
    jobs = max(1, min(cap_at_cores(jobs, "--jobs"), len(todo)))
    echo(f"sweep: {len(runs)} runs, {len(runs) - len(todo)} done, refused or busy, {len(todo)} to run, {jobs} at a "
         f"time")
    children = _Children(echo)
    old = signal.signal(signal.SIGTERM, _raise_interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    pool = ThreadPoolExecutor(max(1, jobs))
    try:
        futures = [pool.submit(children.run, r) for r in todo]
        rcs = [f.result() for f in futures]
    except KeyboardInterrupt:
        live = children.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        echo(f"sweep: interrupted; {len(live)} running run(s) stopped at their last checkpoint. Start the same "
             f"command again to finish the missing runs.")
        return 130
    finally:
        pool.shutdown(wait=False)
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    from fedblend.results.report import report

    done = [r for r in runs if (r.out / "summary.json").exists()]
    if done:
        echo(report([str(out)], Path(out) / "report", plots=report_plots), end="")
        echo(f"report in {Path(out) / 'report'}")
    return exit_code(runs, rcs)


def _announce(runs: list[SweepRun], echo) -> None:
    """One line per run that is not run: done earlier, refused, busy."""
    for r in runs:
        if r.action == "skip":
            echo(f"[done] {r.name} seed {r.seed} ({r.why} earlier, skipped)" if r.why == "finished" else
                 f"[done] {r.name} seed {r.seed} ({r.why}; skipped)")
        elif r.action == "refuse":
            echo(f"[REFUSED] {r.name} seed {r.seed}: {r.why}")
        elif r.action == "busy":
            echo(f"[BUSY] {r.name} seed {r.seed}: {r.why}")


class _Children:
    """The sweep's running child processes (one per run, each in its own session), started from the pool's
    threads and stopped together on an interrupt."""

    def __init__(self, echo):
        self.echo = echo
        self.procs: dict[int, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self, run: SweepRun) -> int:
        """Run ``run``'s command to its end (output to its ``stdout.log``); its exit code."""
        run.out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(run.out / "stdout.log", "a") as log:
            log.write(f"$ {' '.join(run.cmd)}\n")
            log.flush()
            with self.lock:  # no run starts once an interrupt has been seen
                if self.stopping.is_set():
                    return 130
                # its own session: a Ctrl-C reaches the children through us, once, as SIGTERM; child_env: the
                # child gets SIGTERM from the kernel when this process dies (fedblend.rundir.die_with_parent)
                p = subprocess.Popen(run.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=child_env())
                self.procs[p.pid] = p
            rc = p.wait()
            with self.lock:
                self.procs.pop(p.pid, None)
        if not self.stopping.is_set():
            self.echo(_summary_line(run, rc, time.perf_counter() - t0))
        return rc

    def stop(self) -> list[subprocess.Popen]:
        """Start no more runs; stop the running ones at their last checkpoint (waited for); those stopped."""
        with self.lock:
            self.stopping.set()
            live = list(self.procs.values())
        for p in live:
            try:
                # SIGTERM, not SIGINT: a sweep started in the background gives its runs SIGINT ignored
                os.killpg(p.pid, signal.SIGTERM)  # the run keeps its last checkpoint and exits 130
            except ProcessLookupError:
                pass
        for p in live:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        return live


def exit_code(runs: list[SweepRun], rcs: list[int]) -> int:
    """The sweep's exit code, as documented for every command (2 bad input, 1 a fault): the largest of its runs'
    (1 a run that failed, 130 interrupted), 2 for a run refused (its directory holds a finished run of another
    config or inputs: the command line asked for something that cannot be done there) or busy, 0 otherwise."""
    failed = [rc for rc in rcs if rc != 0] + [2 for r in runs if r.action in ("refuse", "busy")]
    return max(failed, default=0)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
