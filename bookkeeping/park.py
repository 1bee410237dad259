"""Carry a campaign's cut runs from one session's machine to the next, through the repository (issue #51).

A session's machine is new each time: a run longer than a session (T4 at 500 rounds, T2's CNN rows at 600) is cut
by the session's end and its checkpoint would be lost with the machine. ``save`` copies every cut run under a
campaign's BASE (a ``checkpoint.pt``, no ``summary.json``, no live writer) into ``parked/`` of this checkout,
which is committed; ``restore``, on the next machine, copies them back under BASE before the runner starts, and the
runner resumes each from its checkpoint (``bookkeeping/campaign.py``: ``--resume``). A resumed run continues
bit for bit on one machine; on another, the rounds after the checkpoint may differ in the last digits (as any two
CPUs do), and ``--resume`` checks every file it reads by content (its sha256 record).

    python bookkeeping/park.py restore ~/campaign     # a session's start, before bookkeeping/campaign.py
    python bookkeeping/park.py save ~/campaign        # its end, once the runner and its runs have stopped

``save`` also removes the parked copy of every run that has finished under BASE since (its finished copy goes to
``results/`` by the collectors) and refuses a run larger than ``--max-mb`` (a method that keeps a model per client
has a checkpoint of hundreds of MB: such a run must fit in one session). Plots and the writer lock are not
carried. Written by hand: a copy with these three checks is shorter than any tool's configuration.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from fedblend.rundir import locked_by  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PARKED = REPO / "parked"
#: the largest run (all its files) ``save`` parks, in MB
MAX_MB = 25.0
#: what is not carried: the writer's lock (its process is gone) and the plots (redrawn at the end)
SKIP = (".fedblend.lock", "*.png")


def checkpointed(run: Path) -> int:
    """The last round the run's checkpoint holds: the last round in ``metrics.jsonl`` down to a multiple of the
    config's ``checkpoint_every`` (capped at ``rounds``); 0 when it has no checkpoint or unreadable files."""
    if not (run / "checkpoint.pt").exists():
        return 0
    try:
        cfg = tomllib.loads((run / "config.toml").read_text())
        rounds, every = int(cfg["rounds"]), int(cfg.get("checkpoint_every", 10))
        last = max((int(json.loads(t)["round"]) for t in (run / "metrics.jsonl").read_text().splitlines()
                    if t.strip()), default=0)
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return 0
    return min(rounds, last - last % every) if every > 0 else 0


#: where a campaign's runs are, under its BASE (a pre-training's run is ``agents/NAME.run``)
RUN_ROOTS = ("runs", "agents")


def _runs(root: Path) -> list[Path]:
    """Run directories (those holding a ``config.toml``) under ``root``'s :data:`RUN_ROOTS`."""
    return sorted(p.parent for sub in RUN_ROOTS if (root / sub).is_dir() for p in (root / sub).rglob("config.toml"))


def cut_runs(base: Path) -> list[Path]:
    """The runs under ``base`` that a session's end cut: a checkpoint, no ``summary.json``, no live writer."""
    return [r for r in _runs(base) if checkpointed(r) > 0 and not (r / "summary.json").exists()
            and locked_by(r) is None]


def size_mb(run: Path) -> float:
    ignore = shutil.ignore_patterns(*SKIP)
    total = 0
    for p in run.rglob("*"):
        if p.is_file() and not ignore(str(p.parent), [p.name]):
            total += p.stat().st_size
    return total / 2**20


def _replace(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*SKIP))


def save(base: Path, parked: Path = PARKED, max_mb: float = MAX_MB) -> dict[str, list[str]]:
    """Park the cut runs of ``base`` (replacing older parked copies), unpark the finished ones; returns the
    relative paths saved, refused for size (with their size) and removed."""
    done: dict[str, list[str]] = {"saved": [], "too_large": [], "removed": []}
    for copy in _runs(parked):
        rel = copy.relative_to(parked)
        if (base / rel / "summary.json").exists():
            shutil.rmtree(copy)
            done["removed"].append(str(rel))
    for run in cut_runs(base):
        rel = run.relative_to(base)
        mb = size_mb(run)
        if mb > max_mb:
            done["too_large"].append(f"{rel} ({mb:.0f} MB)")
            continue
        if checkpointed(parked / rel) <= checkpointed(run):
            _replace(run, parked / rel)
            done["saved"].append(f"{rel} (round {checkpointed(run)})")
    return done


def restore(base: Path, parked: Path = PARKED) -> dict[str, list[str]]:
    """Copy each parked run to its place under ``base`` unless the run there is finished or checkpointed at least
    as far; returns the relative paths restored and kept."""
    done: dict[str, list[str]] = {"restored": [], "kept": []}
    for copy in _runs(parked):
        rel = copy.relative_to(parked)
        here = base / rel
        if (here / "summary.json").exists() or checkpointed(here) >= checkpointed(copy) or locked_by(here):
            done["kept"].append(str(rel))
            continue
        _replace(copy, here)
        done["restored"].append(f"{rel} (round {checkpointed(copy)})")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("base", type=Path, help="the campaign's working directory (bookkeeping/campaign.py --base)")
    ap.add_argument("--parked", type=Path, default=PARKED)
    ap.add_argument("--max-mb", type=float, default=MAX_MB)
    args = ap.parse_args(argv)
    base = args.base.resolve()
    done = save(base, args.parked, args.max_mb) if args.action == "save" else restore(base, args.parked)
    for what, paths in done.items():
        for p in paths:
            print(f"{what}: {p}")
    if not any(done.values()):
        print(f"nothing to {args.action}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
