"""Run the campaigns' missing runs (``tables.py left --commands``), N at a time, each at its own commit, until a
deadline: what a session on a fresh machine starts first.

    python bookkeeping/tables.py left --commands > queue.txt     # then reorder or delete lines as the plan needs
    setsid nohup python bookkeeping/campaign.py queue.txt --until 22:05 --jobs 2 --base ~/campaign &

A queue line is ``MINUTES<TAB>COMMIT<TAB>fedblend run|pretrain CONFIG ARGS...`` (lines starting with ``#`` are
skipped). Every command runs as ``python -m fedblend.cli.main`` imported from a detached worktree of this
repository at COMMIT (``BASE/tree-<commit>``, made once; ``HEAD`` is this checkout's commit when the runner
starts), so a run records the commit it ran, with BASE as its working directory: the relative ``--out`` folders
and agent files (``agents/...``) of every commit meet there, and a relative CONFIG is read from the commit's
tree. A line is started only when it can finish before ``--until`` (MINUTES x ``--scale`` x :data:`MARGIN`)
and when the agent file its config loads (``options.agent``) exists, so a pre-trained row waits for its
pre-training line; the others are tried in order. The queue file is rewritten without each line as it starts,
so what is left stays there (a line whose run has its ``summary.json`` already is dropped, logged as
skipped); a run whose ``--out`` holds a checkpoint is resumed (``--resume``), and only the rounds
after that checkpoint count against the deadline (:func:`share_left`); one cut before its first checkpoint
starts over (``--force``, :func:`restart_flags`). Runs another process is writing under
BASE (a runner started earlier, by hand: their ``.fedblend.lock`` is held) take their places among the ``--jobs``
(:func:`busy_elsewhere`), so a runner restarted mid-session does not start more than ``--jobs`` at once.
``--fill``: when a place is free and no line fits, start the first ready line anyway; the session's end then
stops it, and a later session resumes it from its last checkpoint (every ``checkpoint_every`` rounds) instead of
the cores idling until the deadline: on a machine that kept BASE, or on a new one through ``parked/``
(``bookkeeping/park.py save BASE`` at the end, ``restore BASE`` before this runner starts). A started line is kept in
``QUEUE.running`` until its run ends (:func:`requeue_cut`): a runner that starts finds there the lines of runs an
earlier runner started and never saw end (the session's end stopped both) and puts them back at the head of the
queue, so a cut run resumes first, without anyone re-adding its line. The log
(``BASE/campaign.log``) has a line per start and end (for a pre-training, whether its agent file is the
committed one, :func:`agent_note`; for a run that failed, where its output is: its line goes to
``QUEUE.failed``, :func:`failed`, to be queued again once the cause is fixed); ``python bookkeeping/tables.py
collect-left BASE/runs`` copies the finished runs into ``results/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src"), str(Path(__file__).resolve().parent)]
from park import checkpointed  # noqa: E402

from fedblend.rundir import locked_by  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: a run is started only if MINUTES x MARGIN fit before the deadline (run times vary with the machine's load)
MARGIN = 1.2
POLL_SECONDS = 20


@dataclass(frozen=True)
class Line:
    minutes: float
    commit: str
    args: list[str]  # after "fedblend"
    text: str

    @property
    def out(self) -> str:
        return self.args[self.args.index("--out") + 1]


def parse(text: str) -> list[Line]:
    """The queue's lines (``#`` comments and blank lines skipped); exits naming a malformed line."""
    lines = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split("\t")
        if len(parts) != 3 or not parts[2].startswith("fedblend ") or "--out" not in parts[2].split():
            raise SystemExit(f"campaign: line {n} is not MINUTES<TAB>COMMIT<TAB>fedblend ... --out DIR: {raw!r}")
        lines.append(Line(float(parts[0]) if parts[0] != "?" else 60.0, parts[1], shlex.split(parts[2])[1:], raw))
    return lines


def head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


#: what ``HEAD`` in a queue line means: this checkout's commit when the runner started
HEAD: dict[str, str] = {}


def tree(commit: str, base: Path) -> Path:
    """The worktree of ``commit`` under ``base`` (made detached on first use)."""
    if commit == "HEAD":
        commit = HEAD.setdefault("HEAD", head())
    path = base / f"tree-{commit[:12]}"
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)
    return path


def config_path(line: Line, base: Path) -> Path:
    """The command's CONFIG: absolute as given, else in the commit's tree."""
    p = Path(line.args[1])
    return p if p.is_absolute() else tree(line.commit, base) / p


def ready(line: Line, base: Path) -> bool:
    """False while the agent file the line's config loads (``options.agent``, relative to ``base``) is absent."""
    agent = tomllib.loads(config_path(line, base).read_text()).get("options", {}).get("agent") or ""
    for i, a in enumerate(line.args[:-1]):  # an override wins
        if a == "--set" and line.args[i + 1].startswith("options.agent="):
            agent = line.args[i + 1].split("=", 1)[1]
    return not agent or (base / agent).exists()


def run_dir(line: Line, base: Path) -> Path:
    """Where the line's run writes: ``--out`` for ``run``; ``--out`` + ``.run`` for ``pretrain`` (its agent file
    is ``--out``)."""
    out = base / line.out
    return out.with_name(out.name + ".run") if line.args[0] == "pretrain" else out


def share_left(line: Line, base: Path) -> float:
    """The share of the run's rounds still to run: 1 without a checkpoint; else the rounds after the last
    checkpoint a resume restarts from (:func:`park.checkpointed`) over its ``rounds``, read from the run's
    ``config.toml``."""
    d = run_dir(line, base)
    try:
        rounds = int(tomllib.loads((d / "config.toml").read_text())["rounds"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return 1.0  # no run yet, or unreadable: assume the whole run
    return max(0.0, 1.0 - checkpointed(d) / rounds) if rounds > 0 else 1.0


def finished(line: Line, base: Path) -> bool:
    """Whether the line's run has ended already: its ``summary.json`` is written (and, for a pre-training, its
    agent file)."""
    return (run_dir(line, base) / "summary.json").exists() and (line.args[0] != "pretrain"
                                                               or (base / line.out).exists())


def fits(line: Line, deadline: float, now: float, scale: float = 1.0, share: float = 1.0) -> bool:
    """Whether the line's run ends before ``deadline``: its minutes x ``share`` (the part left, see
    :func:`share_left`) x ``scale`` (this machine's speed against the one that measured them) x :data:`MARGIN`
    from ``now``."""
    return now + line.minutes * share * scale * 60 * MARGIN <= deadline


def busy_elsewhere(base: Path, ours: set[Path]) -> list[Path]:
    """Run directories under ``base`` whose writer lock another process holds (not one of ``ours``)."""
    found = []
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not (d.startswith("tree-") and Path(root) == base) and d != ".git"]
        d = Path(root)
        if ".fedblend.lock" in files and d.resolve() not in ours and locked_by(d) is not None:
            found.append(d)
    return sorted(found)


def pick(todo: list[Line], free: int, base: Path, deadline: float, now: float, scale: float = 1.0,
         fill: bool = False) -> list[tuple[Line, bool]]:
    """Up to ``free`` ready lines of ``todo`` to start now, in queue order, each with whether it ends past the
    deadline: first those that fit; with ``fill``, then the first others that are ready."""
    todo = [line for line in todo if ready(line, base)]
    on_time = [line for line in todo if fits(line, deadline, now, scale, share_left(line, base))][:free]
    late = [line for line in todo if line not in on_time][:free - len(on_time)] if fill else []
    return [(line, False) for line in on_time] + [(line, True) for line in late]


def restart_flags(line: Line, base: Path) -> list[str]:
    """How the line's run starts over what an earlier, cut run left: ``--resume`` from its checkpoint;
    ``--force`` when it was cut before its first checkpoint (its files are only the start of a run that has
    nothing to resume from, and ``fedblend`` refuses to write over them without it); nothing for a new run.
    A finished run (``finished``) or one another process writes (``busy_elsewhere``) is never started."""
    d = run_dir(line, base)
    if (d / "checkpoint.pt").exists():
        return ["--resume"]
    return ["--force"] if d.is_dir() and any(d.iterdir()) else []


def start(line: Line, base: Path, log, note: str = "") -> subprocess.Popen:
    wt = tree(line.commit, base)
    args = [line.args[0], str(config_path(line, base)), *line.args[2:], *restart_flags(line, base)]
    out = base / line.out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(wt / "src"))
    share = share_left(line, base)
    left = f", {share:.0%} left" if share < 1 else ""
    log.write(f"{time.strftime('%H:%M:%S')} start {line.out} ({line.minutes:.0f} min{left}, {wt.name}){note}\n")
    log.flush()
    with open(f"{out}.log", "w") as f:
        return subprocess.Popen([sys.executable, "-m", "fedblend.cli.main", *args, "--quiet"], cwd=base, env=env,
                                stdout=f, stderr=subprocess.STDOUT)


def agent_note(line: Line, base: Path) -> str:
    """For a finished pre-training whose CONFIG sits beside a committed ``agent.sha256``: whether the new agent
    file is that same file (`` (agent: same sha256 as ...)``) or another (training on another CPU may end
    elsewhere: the pre-trained rows then load another agent than the committed runs did); empty otherwise."""
    if line.args[0] != "pretrain":
        return ""
    recorded = config_path(line, base).parent / "agent.sha256"
    agent = base / line.out
    if not recorded.exists() or not agent.exists():
        return ""
    want = recorded.read_text().split()[0]
    got = hashlib.sha256(agent.read_bytes()).hexdigest()
    return f" (agent: {'same sha256 as' if got == want else f'sha256 {got[:12]} differs from'} {recorded})"


def failed(queue: Path, line: Line) -> str:
    """A run that ended with an error keeps its line: appended to ``QUEUE.failed`` (the queue file itself
    dropped it when it started), so a failure that has a fix (a missing package, a full disk) loses no line;
    the log's note names that file and the run's output."""
    kept = queue.with_name(queue.name + ".failed")
    with open(kept, "a") as f:
        f.write(line.text + "\n")
    return f" (failed: see {line.out}.log; its line is kept in {kept})"


def running_file(queue: Path) -> Path:
    """``QUEUE.running``: the lines whose runs this runner (or an earlier one) started and has not seen end."""
    return queue.with_name(queue.name + ".running")


def note_started(queue: Path, line: Line) -> None:
    with open(running_file(queue), "a") as f:
        f.write(line.text + "\n")


def note_ended(queue: Path, line: Line) -> None:
    kept = running_file(queue)
    if kept.exists():
        rest = [t for t in kept.read_text().splitlines() if t != line.text]
        kept.write_text("".join(t + "\n" for t in rest))


def requeue_cut(queue: Path, base: Path, log) -> list[Line]:
    """The lines of ``QUEUE.running`` whose runs are neither finished nor written by a live process (a runner
    and its runs stopped by a session's end): put back at the head of the queue, in the order they started,
    and returned; their runs resume from their checkpoints (:func:`restart_flags`). A finished run's line is
    dropped; a run another process still writes keeps its line in ``QUEUE.running`` (its runner is alive)."""
    kept = running_file(queue)
    if not kept.exists():
        return []
    live = {d.resolve() for d in busy_elsewhere(base, set())}
    back, stay = [], []
    for line in parse(kept.read_text()):
        if finished(line, base):
            continue
        (stay if run_dir(line, base).resolve() in live else back).append(line)
    present = queue.read_text().splitlines() if queue.exists() else []
    head = [line.text for line in back if line.text not in present]
    queue.write_text("".join(t + "\n" for t in head + present))
    kept.write_text("".join(line.text + "\n" for line in stay))
    for line in back:
        log.write(f"{time.strftime('%H:%M:%S')} requeue {line.out}: an earlier runner started it and stopped "
                  f"before it ended\n")
    log.flush()
    return back


def drop(queue: Path, line: Line) -> None:
    """Rewrite the queue file without ``line`` (what is left stays there for the next runner)."""
    rest = [t for t in queue.read_text().splitlines() if t != line.text]
    queue.write_text("".join(t + "\n" for t in rest))


def deadline_of(text: str, now: dt.datetime) -> float:
    """``HH:MM`` today (tomorrow when already past) as a timestamp."""
    h, m = (int(x) for x in text.split(":"))
    when = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return (when if when > now else when + dt.timedelta(days=1)).timestamp()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("queue", type=Path)
    ap.add_argument("--until", required=True, help="HH:MM: start no run that would end after it (unless --fill)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="a run's time here over the queue's MINUTES (e.g. 1.6 on a machine where rounds take 1.6x)")
    ap.add_argument("--base", type=Path, required=True, help="working directory of the runs (runs/, agents/)")
    ap.add_argument("--fill", action="store_true",
                    help="when no line fits, start the first ready one anyway (a later session resumes it)")
    args = ap.parse_args(argv)
    deadline = deadline_of(args.until, dt.datetime.now())
    HEAD["HEAD"] = head()
    args.base.mkdir(parents=True, exist_ok=True)
    base = args.base.resolve()
    running: dict[str, tuple[subprocess.Popen, Line]] = {}
    with open(base / "campaign.log", "a") as log:
        requeue_cut(args.queue, base, log)
        while True:
            for key, (proc, line) in list(running.items()):
                if proc.poll() is not None:
                    note = agent_note(line, base) if proc.returncode == 0 else failed(args.queue, line)
                    log.write(f"{time.strftime('%H:%M:%S')} end rc={proc.returncode} {line.out}{note}\n")
                    log.flush()
                    note_ended(args.queue, line)
                    del running[key]
            queue = parse(args.queue.read_text())
            for line in [line for line in queue if line.out not in running and finished(line, base)]:
                log.write(f"{time.strftime('%H:%M:%S')} skip {line.out}: finished already (summary.json)\n")
                log.flush()
                drop(args.queue, line)
                queue.remove(line)
            ours = {run_dir(line, base).resolve() for _, line in running.values()}
            elsewhere = busy_elsewhere(base, ours)
            free = max(0, args.jobs - len(running) - len(elsewhere))
            todo = [line for line in queue if line.out not in running and run_dir(line, base) not in elsewhere]
            for line, late in pick(todo, free, base, deadline, time.time(), args.scale, args.fill):
                note = f" (past {args.until}: --fill, resumable from its checkpoints)" if late else ""
                running[line.out] = (start(line, base, log, note), line)
                drop(args.queue, line)
                note_started(args.queue, line)
            if not running and not elsewhere:
                log.write(f"{time.strftime('%H:%M:%S')} nothing left that fits before {args.until}\n")
                return 0
            time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
