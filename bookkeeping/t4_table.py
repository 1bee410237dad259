"""Collect T4 runs (pFedRLLA paper protocol) into the docs/benchmarks.md tables.

    python bookkeeping/t4_table.py RUNS_ROOT            # prints markdown tables

Run folders are named ``t4-{dataset}-{partition}-{row}-s{seed}`` (as ``fedblend run ... --out``); each holds the
run's ``summary.json``. Prints, per dataset: best personalized test accuracy (mean ± sample std over seeds, ``n``
seeds), rounds to the config's target accuracy (``-`` = not reached within the budget), BP / AP of pFedRLLA rows, and
for every column the margin of pFedRLLA (best of its rows) over the best other row.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"t4-(?P<ds>[a-z_]+)-(?P<col>pat\d|dir[0-9.]+|domains)-(?P<row>.+)-s(?P<seed>\d+)$")
COLS = ["pat2", "pat5", "dir0.1", "dir1.0", "domains"]
ROWS = ["local", "fedavg", "fedavg-ft", "fedala", "ditto", "apfl", "fedrep", "fedbabu", "fedfomo", "pfedrlla",
        "pfedrlla-pretrained"]


def cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    if not values:
        return ""
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f} (1)"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f} ({len(values)})"


def load(root: Path) -> dict:
    runs: dict = defaultdict(list)
    for summary in sorted(root.glob("*/summary.json")):
        m = NAME.match(summary.parent.name)
        if not m:
            continue
        s = json.loads(summary.read_text())
        if s.get("status") != "finished":
            continue
        runs[(m["ds"], m["col"], m["row"])].append(s)
    return runs


def table(runs: dict, ds: str, rows: list[str], key, fmt) -> list[str]:
    cols = [c for c in COLS if any(k[0] == ds and k[1] == c for k in runs)]
    out = ["| row | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for row in rows:
        if not any((ds, c, row) in runs for c in cols):
            continue
        out.append(f"| {row} | " + " | ".join(fmt([key(s) for s in runs.get((ds, c, row), [])]) for c in cols) + " |")
    return out


def rtt(values: list) -> str:
    if not values:
        return ""
    return ", ".join("-" if v is None else str(v) for v in values)


def main(root: str) -> None:
    runs = load(Path(root))
    for ds in sorted({k[0] for k in runs}):
        rows = [r for r in ROWS if any(k[0] == ds and k[2] == r for k in runs)]
        rows += sorted({k[2] for k in runs if k[0] == ds and k[2] not in ROWS})
        budget = sorted({s["rounds"] for k, v in runs.items() if k[0] == ds for s in v})
        print(f"\n### {ds}: best personalized test accuracy %, mean ± std (seeds), rounds {budget}\n")
        print("\n".join(table(runs, ds, rows, lambda s: s["best_accuracy"], cell)))
        target = sorted({s.get("target_accuracy") for k, v in runs.items() if k[0] == ds for s in v} - {None})
        print(f"\nrounds to {target} (per seed; evaluated every eval.every rounds)\n")
        print("\n".join(table(runs, ds, rows, lambda s: s.get("rounds_to_target"), rtt)))
        print("\nBP / AP (best, %)\n")
        print("\n".join(table(runs, ds, rows, lambda s: (s.get("bp_best_accuracy"), s.get("ap_best_accuracy")),
                              lambda v: "" if not v or v[0][0] is None else
                              f"{cell([a for a, _ in v])} / {cell([b for _, b in v])}")))
        print("\nseconds per round (mean over seeds)\n")
        print("\n".join(table(runs, ds, rows, lambda s: s["seconds_per_round"],
                              lambda v: f"{statistics.fmean(v):.1f}" if v else "")))
        print()
        for col in COLS:
            ours = {r: statistics.fmean(s["best_accuracy"] for s in runs[(ds, col, r)])
                    for r in ("pfedrlla", "pfedrlla-pretrained") if (ds, col, r) in runs}
            others = {r: statistics.fmean(s["best_accuracy"] for s in runs[(ds, col, r)])
                      for r in ROWS if (ds, col, r) in runs and not r.startswith("pfedrlla")}
            if ours and others:
                best_r, best_o = max(ours.items(), key=lambda kv: kv[1]), max(others.items(), key=lambda kv: kv[1])
                print(f"- {ds} {col}: best pFedRLLA row `{best_r[0]}` {100 * best_r[1]:.2f} vs best other "
                      f"`{best_o[0]}` {100 * best_o[1]:.2f}: {100 * (best_r[1] - best_o[1]):+.2f} points "
                      f"({len(others)} other rows)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
