"""The report's table: one row per (label, config hash) over the finished runs, mean ± std over seeds.

Runs are grouped by their label (config ``name``, or dataset-partition-method) and the hash of their resolved
config without its seed (:func:`~fedblend.results.runs.group_key`; the "config" column): every seed of one config
becomes one row with best and final personalized accuracy, global accuracy where a global model exists, the
final round's worst client and 10th percentile, and seconds per round. Two runs of one label with different
settings are two rows (the hash tells them apart); a seed that appears twice in a row is warned about
(:func:`notes`). Written as markdown, CSV (with plain mean / std columns) and LaTeX (booktabs).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common.jsonio import dotted_keys
from fedblend.results.names import method_name
from fedblend.results.runs import group_key, read_summary, skip_reason
from fedblend.results.stats import mean_or_none, mean_std_cell

COMPARED = ("best_accuracy", "final_accuracy", "global_best_accuracy", "global_final_accuracy")
#: per seed beside :data:`COMPARED`: the target and the first evaluated round that reached it (summary.json)
TARGET_KEYS = ("target_accuracy", "rounds_to_target")
COLUMNS = [("label", "run"), ("method", "method"), ("config_hash", "config"), ("n", "seeds"), ("rounds", "rounds"),
           ("best", "best acc %"), ("final", "final acc %"), ("global_best", "global best %"), ("global_final", "global final %"),
           ("worst_client", "worst client %"), ("p10_client", "client p10 %"), ("s_per_round", "s/round")]
#: shown after "client p10 %" when a row's runs set ``eval.target`` (:func:`rounds_to_target_cell`)
TARGET_COLUMN = ("to_target", "rounds to target")


def aggregate(runs: list[Path], key=group_key, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per (label, config hash) over the finished runs (mean ± std over seeds); ``key`` maps a summary
    (with its run directory in ``"_dir"``) to its group, :func:`group_key` by default (a caller that has grouped
    the runs itself, e.g. by results folder, passes its own). A finished run whose summary lacks a field or holds
    one of the wrong type is left out, with one line in ``skipped`` (:func:`skip_reason`)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        s = read_summary(r)
        if not s or s.get("status", "finished") != "finished":
            continue
        why = skip_reason(r, s)
        if why:
            if skipped is not None:
                skipped.append(why)
            continue
        s["_dir"] = str(r)
        groups[key(s)].append(s)
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
            "best": mean_std_cell([s["best_accuracy"] for s in ss]),
            "final": mean_std_cell([s["final_accuracy"] for s in ss]),
            "global_best": mean_std_cell([s.get("global_best_accuracy") for s in ss]),
            "global_final": mean_std_cell([s.get("global_final_accuracy") for s in ss]),
            "s_per_round": mean_std_cell([s["seconds_per_round"] for s in ss], 1.0),
            "worst_client": mean_std_cell([s.get("final_acc_client_worst") for s in ss]),
            "p10_client": mean_std_cell([s.get("final_acc_client_p10") for s in ss]),
            "to_target": rounds_to_target_cell(ss),
            "best_mean": mean_or_none([s["best_accuracy"] for s in ss]),
            "by_seed": {s["seed"]: {k: s.get(k) for k in COMPARED + TARGET_KEYS} for s in ss},
            "dirs": [s["_dir"] for s in ss],
            "_config": (ss[0].get("run") or {}).get("config") or {},
        })
    for row, legend in zip(rows, legend_labels(rows)):
        row["legend"] = legend
    return rows


def legend_labels(rows: list[dict]) -> list[str]:
    """A figure legend per row: the method's name (FedALA, FedProx+ALA, ...); where several rows share a method,
    followed by the config fields that tell them apart (``FedAPA (options.mu=0.3)``), else by the row's label."""
    from fedblend.config import config_diff

    out = []
    for row in rows:
        name = method_name(row["method"])
        twins = [r for r in rows if r["method"] == row["method"] and r is not row]
        if twins:
            ignore = ("seed", "name", "log", "backend", "workers", "store")
            keys = sorted({d.split(":")[0] for t in twins for d in config_diff(t["_config"], row["_config"], ignore)})
            flat = dotted_keys(row["_config"])
            diff = ", ".join(f"{k}={_shown(flat.get(k, '-'))}" for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
            name += f" ({diff or row['label']})"
        out.append(name)
    return out


def _shown(value: Any) -> str:
    """A config value in a legend: an empty string as ``""`` (``options.agent=""``, not ``options.agent=``)."""
    return '""' if value == "" else str(value)


def rounds_to_target_cell(summaries: list[dict]) -> str:
    """``eval.target``'s convergence count over a group's seeds: the mean ± std of ``rounds_to_target`` over the
    seeds that reached the target, then the target (``20.0 ± 0.0 to 85%``), with ``(2 of 3 seeds)`` when some did
    not, ``not reached (85%)`` when none did, and ``-`` when the runs set no target. Rounds are counted at the
    evaluated rounds, so with ``eval.every = 10`` a count is a multiple of 10."""
    targets = sorted({s["target_accuracy"] for s in summaries if s.get("target_accuracy") is not None})
    if not targets:
        return "-"
    target = "/".join(f"{100 * t:g}%" for t in targets)
    hits = [s["rounds_to_target"] for s in summaries if s.get("rounds_to_target") is not None]
    if not hits:
        return f"not reached ({target})"
    text = f"{mean_std_cell(hits, 1.0, 1)} to {target}"
    return text + (f" ({len(hits)} of {len(summaries)} seeds)" if len(hits) < len(summaries) else "")



def columns(rows: list[dict]) -> list[tuple[str, str]]:
    """The table's columns: :data:`COLUMNS`, with :data:`TARGET_COLUMN` where some row's runs set a target."""
    if not any(r.get("to_target", "-") != "-" for r in rows):
        return COLUMNS
    return COLUMNS[:-1] + [TARGET_COLUMN] + COLUMNS[-1:]


def markdown_table(rows: list[dict]) -> str:
    """The rows of :func:`aggregate` as a markdown table."""
    cols = columns(rows)
    head = "| " + " | ".join(h for _, h in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(str(r[k]) for k, _ in cols) + " |" for r in rows]
    return "\n".join([head, sep] + body) + "\n"


def csv_table(rows: list[dict]) -> str:
    """The table as CSV: the same columns, plus best / final accuracy mean and std (%, ddof = 1) as plain numbers."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    nums = [f"{k}_{stat}" for k in ("best_accuracy", "final_accuracy") for stat in ("mean", "std")]
    cols = columns(rows)
    w.writerow([h for _, h in cols] + nums)
    for r in rows:
        extra = []
        for k in ("best_accuracy", "final_accuracy"):
            vals = np.array([v[k] for v in r["by_seed"].values() if v.get(k) is not None], dtype=float) * 100
            extra += [f"{vals.mean():.4f}" if len(vals) else "",
                      f"{vals.std(ddof=1):.4f}" if len(vals) > 1 else ""]
        w.writerow([r[k] for k, _ in cols] + extra)
    return buf.getvalue()


def latex_table(rows: list[dict]) -> str:
    """The table as a LaTeX ``tabular`` (booktabs), ± as ``$\\pm$``."""

    def esc(v: object) -> str:
        text = str(v).replace("\\", "\\textbackslash{}")
        for ch in "&%$#_{}":
            text = text.replace(ch, "\\" + ch)
        return text.replace("±", "$\\pm$")

    cols = columns(rows)
    lines = ["\\begin{tabular}{l" + "r" * (len(cols) - 1) + "}", "\\toprule",
             " & ".join(esc(h) for _, h in cols) + " \\\\", "\\midrule"]
    lines += [" & ".join(esc(r[k]) for k, _ in cols) + " \\\\" for r in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"



def notes(rows: list[dict], pending: list[dict], skipped: list[str] = ()) -> str:
    """Warnings under the table: duplicate seeds in a row, labels split over several configs, unfinished runs, runs
    left out (``skipped``: one line each)."""
    lines = list(skipped)
    for r in rows:
        if r["duplicate_seeds"]:
            lines.append(f"warning: {r['label']} (config {r['config_hash']}) has seed(s) "
                         f"{', '.join(map(str, r['duplicate_seeds']))} more than once: {', '.join(r['dirs'])}")
    labels = [r["label"] for r in rows]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        lines.append(f"warning: {label} has {labels.count(label)} different configs (one row each, see the "
                     f"method and config columns; give each config its own name)")
    for u in pending:
        why = f": {u['reason']}" if u["reason"] else ""
        head = "not in the table (clients lost)" if str(u["status"]).startswith("finished-") else "unfinished"
        lines.append(f"{head}: {u['dir']} ({u['status']}, last round {u['last_round']}){why}")
    return "".join(f"\n{x}" for x in lines) + ("\n" if lines else "")
