"""``fedblend report``: turn a set of run directories into a table (mean ± std over seeds) and curve PNGs.

Std is the sample standard deviation over seeds (ddof = 1).
Runs are grouped by their label (config ``name``, or dataset-partition-method) and the hash of their resolved
config without its seed (:func:`group_key`; the "config" column): every seed of one config becomes one row with best
and final personalized accuracy, global accuracy where a global model exists, and seconds per round. Two runs
of one label with different settings are two rows (the hash tells them apart); a seed that appears twice in a
row is warned about; runs without a finished summary (interrupted, or stopped by a non-finite update) are
listed with their last round instead of being averaged.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common.jsonio import dumps
from fedblend.config import config_hash

MARKERS = ("summary.json", "metrics.jsonl")  # a directory holding either is a run (finished or not)


def _is_run(p: Path) -> bool:
    return any((p / m).exists() for m in MARKERS)


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Every run directory (holding ``summary.json`` or ``metrics.jsonl``) under the given paths."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if _is_run(p):
            runs.append(p)
        elif p.is_dir():
            runs += sorted({q.parent for m in MARKERS for q in p.rglob(m)})
        else:
            raise FileNotFoundError(f"{p}: not a run directory (no summary.json or metrics.jsonl) nor a folder "
                                    f"of runs")
    return runs


def group_key(summary: dict) -> tuple[str, str]:
    """(label, hash of the resolved config without its seed): the seeds of one config share it."""
    cfg = (summary.get("run") or {}).get("config")
    if cfg is None:
        return summary.get("label", summary.get("method", "?")), "-"
    return summary.get("label", summary["method"]), config_hash({k: v for k, v in cfg.items() if k != "seed"})


def last_round(run: Path) -> int:
    """The last round recorded in a run's ``metrics.jsonl`` (0 when none)."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return max((r.get("round", 0) for r in rows if "stopped" not in r), default=0)


def unfinished(runs: list[Path]) -> list[dict[str, Any]]:
    """Runs without a finished summary: their directory, status and last recorded round."""
    out = []
    for r in runs:
        s = json.loads((r / "summary.json").read_text()) if (r / "summary.json").exists() else {}
        if s.get("status", "finished") != "finished" or not s:
            out.append({"dir": str(r), "status": s.get("status", "unfinished"), "last_round": last_round(r),
                        "reason": s.get("stop_reason", "")})
    return out


def _ms(values: list[float], scale: float = 100.0) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    a = np.asarray(vals) * scale
    return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}" if len(a) > 1 else f"{a.mean():.2f}"


def aggregate(runs: list[Path]) -> list[dict[str, Any]]:
    """One row per (label, config hash) over the finished runs (mean ± std over seeds)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        if not (r / "summary.json").exists():
            continue
        s = json.loads((r / "summary.json").read_text())
        if s.get("status", "finished") != "finished":
            continue
        s["_dir"] = str(r)
        groups[group_key(s)].append(s)
    rows = []
    for (label, h), ss in sorted(groups.items()):
        seeds = sorted(s["seed"] for s in ss)
        rows.append({
            "label": label,
            "config_hash": h,
            "duplicate_seeds": sorted({x for x in seeds if seeds.count(x) > 1}),
            "method": ss[0]["method"],
            "seeds": seeds,
            "n": len(ss),
            "rounds": ss[0]["rounds"],
            "best": _ms([s["best_accuracy"] for s in ss]),
            "final": _ms([s["final_accuracy"] for s in ss]),
            "global_best": _ms([s.get("global_best_accuracy") for s in ss]),
            "global_final": _ms([s.get("global_final_accuracy") for s in ss]),
            "s_per_round": _ms([s["seconds_per_round"] for s in ss], 1.0),
            "best_mean": _mean_or_none([s["best_accuracy"] for s in ss]),
            "dirs": [s["_dir"] for s in ss],
        })
    return rows


def _mean_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


COLUMNS = [("label", "run"), ("config_hash", "config"), ("n", "seeds"), ("rounds", "rounds"), ("best", "best acc %"),
           ("final", "final acc %"), ("global_best", "global best %"), ("global_final", "global final %"),
           ("s_per_round", "s/round")]


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(str(r[k]) for k, _ in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep] + body) + "\n"


def plot_curves(rows: list[dict], path: Path, key: str = "acc") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        curves = []
        for d in row["dirs"]:
            ms = [json.loads(line) for line in Path(d, "metrics.jsonl").read_text().splitlines() if line]
            curves.append({m["round"]: m[key] for m in ms if key in m})
        if not any(curves):
            continue
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        vals = np.array([[c[r] for r in rounds] for c in curves]) * 100
        mean, std = vals.mean(0), vals.std(0)
        ax.plot(rounds, mean, label=row["label"])
        ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(("global " if key.startswith("global") else "personalized ") + "test accuracy (%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def notes(rows: list[dict], pending: list[dict]) -> str:
    """Warnings under the table: duplicate seeds in a row, labels split over several configs, unfinished runs."""
    lines = []
    for r in rows:
        if r["duplicate_seeds"]:
            lines.append(f"warning: {r['label']} (config {r['config_hash']}) has seed(s) "
                         f"{', '.join(map(str, r['duplicate_seeds']))} more than once: {', '.join(r['dirs'])}")
    labels = [r["label"] for r in rows]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        lines.append(f"warning: {label} has {labels.count(label)} different configs (one row each, see the "
                     f"config column)")
    for u in pending:
        why = f": {u['reason']}" if u["reason"] else ""
        lines.append(f"unfinished: {u['dir']} ({u['status']}, last round {u['last_round']}){why}")
    return "".join(f"\n{x}" for x in lines) + ("\n" if lines else "")


def report(paths: list[str | Path], out_dir: str | Path | None = None, plots: bool = True) -> str:
    runs = find_runs(paths)
    rows, pending = aggregate(runs), unfinished(runs)
    if not rows and not pending:
        raise FileNotFoundError(f"no runs found under {[str(p) for p in paths]}")
    table = markdown_table(rows) + notes(rows, pending)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table)
        (out / "table.json").write_text(dumps(rows, indent=2))
        (out / "unfinished.json").write_text(dumps(pending, indent=2))
        if plots and rows:
            plot_curves(rows, out / "accuracy.png", "acc")
            if any(r["global_best"] != "-" for r in rows):
                plot_curves(rows, out / "global_accuracy.png", "global_acc")
    return table
