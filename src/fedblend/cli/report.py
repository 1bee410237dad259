"""``fedblend report``: turn a set of run directories into a table (mean ± std over seeds) and curve PNGs.

Std is the sample standard deviation over seeds (ddof = 1).
Runs are grouped by their label (config ``name``, or dataset-partition-method) - every seed of a config
becomes one row with best and final personalized accuracy, global accuracy where a global model exists, and
seconds per round.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Every directory holding a ``summary.json`` under the given paths."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            runs.append(p)
        elif p.is_dir():
            runs += sorted(q.parent for q in p.rglob("summary.json"))
        else:
            raise FileNotFoundError(f"{p}: not a run directory (no summary.json) nor a folder of runs")
    return runs


def _ms(values: list[float], scale: float = 100.0) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    a = np.asarray(vals) * scale
    return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}" if len(a) > 1 else f"{a.mean():.2f}"


def aggregate(runs: list[Path]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        s = json.loads((r / "summary.json").read_text())
        s["_dir"] = str(r)
        groups[s.get("label", s["method"])].append(s)
    rows = []
    for label, ss in sorted(groups.items()):
        rows.append({
            "label": label,
            "method": ss[0]["method"],
            "seeds": sorted(s["seed"] for s in ss),
            "n": len(ss),
            "rounds": ss[0]["rounds"],
            "best": _ms([s["best_accuracy"] for s in ss]),
            "final": _ms([s["final_accuracy"] for s in ss]),
            "global_best": _ms([s.get("global_best_accuracy") for s in ss]),
            "global_final": _ms([s.get("global_final_accuracy") for s in ss]),
            "s_per_round": _ms([s["seconds_per_round"] for s in ss], 1.0),
            "best_mean": float(np.mean([s["best_accuracy"] for s in ss])),
            "dirs": [s["_dir"] for s in ss],
        })
    return rows


COLUMNS = [("label", "run"), ("n", "seeds"), ("rounds", "rounds"), ("best", "best acc %"),
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


def report(paths: list[str | Path], out_dir: str | Path | None = None, plots: bool = True) -> str:
    rows = aggregate(find_runs(paths))
    if not rows:
        raise FileNotFoundError(f"no runs found under {[str(p) for p in paths]}")
    table = markdown_table(rows)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table)
        (out / "table.json").write_text(json.dumps(rows, indent=2))
        if plots:
            plot_curves(rows, out / "accuracy.png", "acc")
            if any(r["global_best"] != "-" for r in rows):
                plot_curves(rows, out / "global_accuracy.png", "global_acc")
    return table
