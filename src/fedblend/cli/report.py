"""``fedblend report``: turn a set of run directories into a table (mean ± std over seeds) and curve PNGs.

Std is the sample standard deviation over seeds (ddof = 1), in the table and in the plots' bands alike.
Runs are grouped by their label (config ``name``, or dataset-partition-method) and the hash of their resolved
config without its seed (:func:`group_key`; the "config" column): every seed of one config becomes one row with best
and final personalized accuracy, global accuracy where a global model exists, and seconds per round. Two runs
of one label with different settings are two rows (the hash tells them apart), and so are runs made with
different files at a path the config names (the hash covers the recorded ``run.inputs`` sha256); a seed that appears twice in a
row is warned about; runs without a finished summary (interrupted, or stopped by a non-finite update) are
listed with their last round instead of being averaged.

``--compare A B`` adds paired per-seed differences A - B (best and final accuracy, in points) over the seeds
both groups have, with the mean difference, its Student-t confidence interval and the paired t-test's p-value
(``scipy.stats``); where both groups' runs set the same ``eval.target``, the rounds to that target are paired
too (in rounds, over the seeds where both reached it; the seeds where a side did not are named). A group is named
by its label, ``label@hash``, its sweep folder, its method, or a unique part of its label.
Written files: ``table.md``, ``table.csv``, ``table.tex``, ``table.json``, ``unfinished.json``,
``compare.json`` / ``compare.md`` (with ``--compare``; fewer than 3 paired seeds add a warning that the interval
means little), ``accuracy.png`` (accuracy and loss curves side by side, legend by method, the setting and the
number of seeds in the title, the band's meaning stated: ``--band std`` (default) or ``ci``; ``--acc-range LOW
HIGH`` zooms the accuracy axis),
``global_accuracy.png`` where a global model exists, and ``per_client.png`` (every client's final-round accuracy
per method, seeds pooled) where the runs recorded per-client results. The table's ``worst client %`` and ``client
p10 %`` are the final round's worst client and 10th percentile, mean ± std over seeds.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.cli.summary_check import REQUIRED, summary_problems
from fedblend.common.errors import ConfigError, UserFileError
from fedblend.common.jsonio import dotted_keys, dumps, read_json_object, read_jsonl
from fedblend.common.optional import MissingPackageError, pyplot
from fedblend.config import config_hash
from fedblend.rundir import DirLock

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
            raise UserFileError(f"{p}: not a run directory (no summary.json or metrics.jsonl) nor a folder of runs")
    return runs


SUMMARY_KEYS = tuple(REQUIRED)  # what a finished run's summary must hold (cli.summary_check)


def _fix(run: Path) -> str:
    return (f"summary.json is written by fedblend at the end of a run: run it again ({run}/config.toml with "
            f"--force), or leave {run} out of the report")


def read_summary(run: Path) -> dict[str, Any]:
    """A run's ``summary.json`` ({} when there is none); :class:`UserFileError` names the file and the fix when it
    is not a JSON object. Its fields are checked where they are used (:func:`skip_reason`)."""
    path = run / "summary.json"
    if not path.exists():
        return {}
    return read_json_object(path, _fix(run))


def skip_reason(run: Path, summary: dict) -> str | None:
    """Why a finished run's summary cannot make a table row (a field missing or of the wrong type,
    :func:`~fedblend.cli.summary_check.summary_problems`), as one line naming the file and the fix; None if it
    can."""
    problems = summary_problems(summary)
    if not problems:
        return None
    return f"skipped {run / 'summary.json'}: {'; '.join(problems)} (not a fedblend summary); {_fix(run)}"


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl`` rows ([] when there is none); a last line being written right now is left out,
    any other damaged line is a :class:`UserFileError` naming the file, the line and the fix."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return read_jsonl(path, f"continue the run (fedblend run {run}/config.toml --out {run} --resume rewrites "
                            f"metrics.jsonl from its checkpoint), delete the line, or leave {run} out of the report",
                      partial_last=True)


def group_key(summary: dict) -> tuple[str, str]:
    """(label, hash of the resolved config without its seed, and of the input files' sha256 where the run
    recorded any): the seeds of one config share it; runs made with another file at a path the config names (a
    re-made agent or init file) are another row."""
    run = summary.get("run")
    cfg = run.get("config") if isinstance(run, dict) else None
    if not isinstance(cfg, dict):
        return summary.get("label", summary.get("method", "?")), "-"
    keyed = {k: v for k, v in cfg.items() if k != "seed"}
    inputs = run.get("inputs")
    if isinstance(inputs, dict) and inputs:
        keyed["inputs"] = {k: v.get("sha256") if isinstance(v, dict) else v for k, v in inputs.items()}
    return summary.get("label", summary["method"]), config_hash(keyed)


def last_round(run: Path) -> int:
    """The last round recorded in a run's ``metrics.jsonl`` (0 when none)."""
    rows = read_metrics(run)
    return max((r["round"] for r in rows if "stopped" not in r and isinstance(r.get("round"), int)), default=0)


def unfinished(runs: list[Path]) -> list[dict[str, Any]]:
    """Runs without a finished summary: their directory, status and last recorded round."""
    out = []
    for r in runs:
        s = read_summary(r)
        if s.get("status", "finished") != "finished" or not s:
            out.append({"dir": str(r), "status": s.get("status", "unfinished"), "last_round": last_round(r),
                        "reason": s.get("stop_reason") or s.get("degraded") or ""})
    return out


def mean_std_cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    a = np.asarray(vals) * scale
    return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


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
            "best_mean": _mean_or_none([s["best_accuracy"] for s in ss]),
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
    from fedblend.figures import method_name

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


def _mean_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


COMPARED = ("best_accuracy", "final_accuracy", "global_best_accuracy", "global_final_accuracy")
#: per seed beside :data:`COMPARED`: the target and the first evaluated round that reached it (summary.json)
TARGET_KEYS = ("target_accuracy", "rounds_to_target")
COLUMNS = [("label", "run"), ("method", "method"), ("config_hash", "config"), ("n", "seeds"), ("rounds", "rounds"),
           ("best", "best acc %"), ("final", "final acc %"), ("global_best", "global best %"), ("global_final", "global final %"),
           ("worst_client", "worst client %"), ("p10_client", "client p10 %"), ("s_per_round", "s/round")]
#: shown after "client p10 %" when a row's runs set ``eval.target`` (:func:`rounds_to_target_cell`)
TARGET_COLUMN = ("to_target", "rounds to target")


def columns(rows: list[dict]) -> list[tuple[str, str]]:
    """The table's columns: :data:`COLUMNS`, with :data:`TARGET_COLUMN` where some row's runs set a target."""
    if not any(r.get("to_target", "-") != "-" for r in rows):
        return COLUMNS
    return COLUMNS[:-1] + [TARGET_COLUMN] + COLUMNS[-1:]


def markdown_table(rows: list[dict]) -> str:
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


# ------------------------------------------------------------------------------------------------ compare
def find_group(rows: list[dict], name: str) -> dict:
    """The row named ``name``: its label, ``label@hash``, the folder holding its seed directories (a sweep's
    ``<config stem>[__grid values]``), its method, or a unique part of its label."""
    for test in (lambda r: f"{r['label']}@{r['config_hash']}" == name, lambda r: r["label"] == name,
                 lambda r: {Path(d).parent.name for d in r["dirs"]} == {name},
                 lambda r: r["method"] == name, lambda r: name in r["label"]):
        hits = [r for r in rows if test(r)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ConfigError(f"--compare {name!r} matches {len(hits)} groups: "
                              f"{', '.join(r['label'] + '@' + r['config_hash'] for r in hits)}; name one of them")
    raise ConfigError(f"--compare {name!r} matches no group; groups: "
                      f"{', '.join(r['label'] + '@' + r['config_hash'] for r in rows) or 'none'}")


def paired_stats(xa: np.ndarray, xb: np.ndarray, seeds: list, level: float, unit: str) -> dict[str, Any]:
    """A - B over paired values: per seed, mean, sample std, Student-t interval and paired t-test p (None with fewer
    than two pairs or zero spread)."""
    from scipy import stats

    d = xa - xb
    res: dict[str, Any] = {"unit": unit, "per_seed": dict(zip(map(str, seeds), d.tolist())),
                           "mean": float(d.mean()) if len(d) else None,
                           "std": float(d.std(ddof=1)) if len(d) > 1 else None, "ci": None, "p": None}
    if len(d) > 1 and d.std(ddof=1) > 0:
        lo, hi = stats.t.interval(level, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        res.update(ci=[float(lo), float(hi)], p=float(stats.ttest_rel(xa, xb).pvalue))
    return res


def paired_differences(a: dict, b: dict, level: float = 0.95) -> dict[str, Any]:
    """A - B per seed both rows have, for each compared accuracy (in points), with the mean difference, its
    Student-t confidence interval (``scipy.stats.t``, n - 1 degrees of freedom) and the paired t-test p-value
    (``scipy.stats.ttest_rel``); interval and p are None with fewer than two seeds or zero spread.

    Where every run of both rows set the same ``eval.target``, ``rounds_to_target`` is paired as well (unit
    "rounds", negative = A reached the target sooner), over the common seeds where both reached it;
    ``not_reached`` names the common seeds where A or B did not (they cannot be paired: a run that never reached
    the target has no count)."""
    seeds = sorted(set(a["by_seed"]) & set(b["by_seed"]), key=int)
    out: dict[str, Any] = {"a": a["label"], "b": b["label"], "a_config": a["config_hash"],
                           "b_config": b["config_hash"], "seeds": seeds, "level": level, "metrics": {}}
    for key in COMPARED:
        pa = [a["by_seed"][s].get(key) for s in seeds]
        pb = [b["by_seed"][s].get(key) for s in seeds]
        if not seeds or any(v is None for v in pa + pb):
            continue
        out["metrics"][key] = paired_stats(np.asarray(pa, dtype=float) * 100, np.asarray(pb, dtype=float) * 100,
                                           seeds, level, "points")
    targets = {v.get("target_accuracy") for row in (a, b) for v in (row["by_seed"][s] for s in seeds)}
    if seeds and len(targets) == 1 and None not in targets:
        ra = {s: a["by_seed"][s].get("rounds_to_target") for s in seeds}
        rb = {s: b["by_seed"][s].get("rounds_to_target") for s in seeds}
        both = [s for s in seeds if ra[s] is not None and rb[s] is not None]
        res = paired_stats(np.asarray([ra[s] for s in both], dtype=float),
                           np.asarray([rb[s] for s in both], dtype=float), both, level, "rounds")
        res.update(target=targets.pop(), not_reached={"a": [s for s in seeds if ra[s] is None],
                                                       "b": [s for s in seeds if rb[s] is None]})
        out["metrics"]["rounds_to_target"] = res
    return out


def compare_text(c: dict) -> str:
    """``compare`` as a markdown table: one row per metric, per-seed differences, mean, interval, p."""
    seeds = c["seeds"]
    pct = f"{round(c['level'] * 100)}% CI"
    lines = [f"\n{c['a']} - {c['b']} (paired by seed over seeds {', '.join(map(str, seeds)) or 'none'}; "
             f"points of accuracy, rounds where marked):", "",
             "| metric | " + " | ".join(f"seed {s}" for s in seeds) + f" | mean | {pct} | p (paired t) |",
             "|---|" + "---|" * (len(seeds) + 3)]
    after = []
    for key, m in c["metrics"].items():
        ci = f"[{m['ci'][0]:+.2f}, {m['ci'][1]:+.2f}]" if m["ci"] else "-"
        p = f"{m['p']:.3g}" if m["p"] is not None else "-"
        mean = f"{m['mean']:+.2f}" if m["mean"] is not None else "-"
        name = key
        if m.get("unit") == "rounds":
            name = f"rounds to {100 * m['target']:g}% (in rounds)"
            missed = [f"{side} did not reach it at seed(s) {', '.join(map(str, m['not_reached'][k]))}"
                      for k, side in (("a", c["a"]), ("b", c["b"])) if m["not_reached"][k]]
            if missed:
                after.append(f"rounds to {100 * m['target']:g}%: {'; '.join(missed)} (not paired)")
        cells = [f"{m['per_seed'][str(s)]:+.2f}" if str(s) in m["per_seed"] else "-" for s in seeds]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} | {ci} | {p} |")
    if not c["metrics"]:
        lines.append("(no seed in common)")
    if after:
        lines += [""] + after
    note = few_seeds_note(len(seeds), c["level"])
    if note:
        lines += ["", f"warning: {note}"]
    return "\n".join(lines) + "\n"


def few_seeds_note(n: int, level: float = 0.95) -> str | None:
    """The warning for a paired comparison over fewer than 3 seeds, whose t-interval means little."""
    if n >= 3:
        return None
    if n < 2:
        return f"{n} paired seed: no interval or p-value; run at least 3 seeds (5 or more for a claim)"
    from scipy import stats

    t = stats.t.ppf(0.5 + level / 2, n - 1)
    return (f"only {n} paired seeds: the {round(level * 100)}% interval uses t = {t:.1f} with {n - 1} degree(s) "
            f"of freedom, so it is very wide and means little; run at least 3 seeds (5 or more for a claim)")


def _curves(row: dict, key: str) -> tuple[list[int], np.ndarray] | None:
    """Rounds every seed of ``row`` recorded ``key`` at, and the values (seeds x rounds)."""
    curves = []
    for d in row["dirs"]:
        ms = read_metrics(Path(d))
        curves.append({m["round"]: m[key] for m in ms
                       if isinstance(m.get(key), (int, float)) and isinstance(m.get("round"), int)})
    if not any(curves):
        return None
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    return rounds, np.array([[c[r] for r in rounds] for c in curves], dtype=float)


def mean_std(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (ddof = 1, as the table; 0 for a single seed) over the first axis."""
    return vals.mean(0), vals.std(0, ddof=1) if len(vals) > 1 else np.zeros(vals.shape[1:])


def ci_halfwidth(vals: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Half-width of the Student-t confidence interval of the mean over the first axis (0 for a single seed)."""
    if len(vals) < 2:
        return np.zeros(vals.shape[1:])
    from scipy import stats

    return stats.t.ppf(0.5 + level / 2, len(vals) - 1) * vals.std(0, ddof=1) / np.sqrt(len(vals))


LINE_STYLES = ("-", "--", ":", "-.")
LEGEND_INSIDE = 5  # more rows than this: the legend goes below the panels
TITLE_CHARS_PER_INCH = 14  # the title (10 pt) wraps at about this many characters per inch of figure width
BANDS = {"std": "band: ± sample std over seeds (ddof = 1)", "ci": "band: 95% t-interval of the mean over seeds"}


def plot_curves(rows: list[dict], path: Path, key: str = "acc", band: str = "std", setting: str | None = None,
                acc_range: tuple[float, float] | None = None) -> None:
    """Write :func:`curves_figure` to ``path``."""
    plt = pyplot("the report's figures")

    fig = curves_figure(rows, key, band, setting, acc_range)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_figure(rows: list[dict], key: str = "acc", band: str = "std", setting: str | None = None,
                  acc_range: tuple[float, float] | None = None):
    """Accuracy (left) and test loss (right) per round, mean over seeds with a band (``"std"``: ± the table's
    sample std; ``"ci"``: the 95% t-interval of the mean), one line per row, the legend by method, the title
    stating the setting (``setting``, else the one every row's config shares) and the number of seeds. A row's
    colour and line style are its position's, or its ``"slot"`` where the caller sets one (the same method in the
    same colour across several figures).
    ``acc_range`` (%, low and high) zooms the accuracy axis, stated in the axis label; the loss axis is left
    whole."""
    plt = pyplot("the report's figures")

    from fedblend.figures import common_setting, integer_rounds

    loss_key = "global_loss" if key.startswith("global") else "loss"
    fig, (ax, lx) = plt.subplots(1, 2, figsize=(11, 4.4))
    curves = [(_curves(r, key), _curves(r, loss_key)) for r in rows]
    # a row without this curve (no global model) is not drawn, and its seeds are not counted in the title
    drawn = [r for r, (acc, _) in zip(rows, curves) if acc and acc[0]] or rows
    seeds = sorted({r["n"] for r in drawn})
    for i, row in enumerate(rows):
        slot = row.get("slot", i)  # a caller's fixed slot keeps a method's colour from one figure to the next
        style = LINE_STYLES[(slot // 10) % len(LINE_STYLES)]  # the colour cycle has 10 colours: then a new style
        for axis, got, scale in ((ax, curves[i][0], 100.0), (lx, curves[i][1], 1.0)):
            if got is None or not got[0]:
                continue
            mean, std = mean_std(got[1] * scale)
            half = std if band == "std" else ci_halfwidth(got[1] * scale)
            label = row["legend"] + (f" (n = {row['n']})" if len(seeds) > 1 else "")
            line, = axis.plot(got[0], mean, label=label, marker="." if len(got[0]) < 30 else None, linestyle=style,
                              color=f"C{slot % 10}")
            lo, hi = mean - half, mean + half  # an accuracy lies in [0, 100] and a loss is >= 0: the band too
            axis.fill_between(got[0], np.maximum(lo, 0.0), np.minimum(hi, 100.0) if axis is ax else hi, alpha=0.2,
                              color=line.get_color())
    who = "global model" if key.startswith("global") else "personalized"
    ax.set_ylabel(f"{who} test accuracy (%)" + (" (zoomed)" if acc_range else ""))
    if acc_range:
        ax.set_ylim(*acc_range)
    lx.set_ylabel(f"{who} test loss")
    for axis in (ax, lx):
        axis.set_xlabel("round")
        integer_rounds(axis)
        axis.grid(alpha=0.3)
    below = 0.0  # the share of the figure's height under the panels that the legend takes
    if len(drawn) <= LEGEND_INSIDE:
        ax.legend(fontsize=8)
    else:  # the figure's legend, below both panels, where it hides no curve
        lines = -(-len(drawn) // 4)
        fig.set_figheight(4.4 + 0.22 * lines)
        below = (0.1 + 0.22 * lines) / fig.get_figheight()
        fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=4, frameon=False)
    n_text = f"{seeds[0]} seed{'s' if seeds[0] != 1 else ''}" if len(seeds) == 1 else \
        f"{min(seeds)}-{max(seeds)} seeds (n per method in the legend)"
    setting = setting or common_setting([r["_config"] for r in rows])
    warn = f" (only {min(seeds)} seeds: the interval is very wide)" if band == "ci" and min(seeds) == 2 else ""
    title = (f"{setting}: " if setting else "") + (
        f"mean over {n_text}; {BANDS[band]}{warn}" if max(seeds) > 1 else "one seed per curve, no band")
    # wrapped to the figure's width, never cut at its edges
    fig.suptitle(textwrap.fill(title, width=int(TITLE_CHARS_PER_INCH * fig.get_figwidth())), fontsize=10)
    fig.tight_layout(rect=(0, below, 1, 1))
    return fig


def plot_per_client(rows: list[dict], path: Path, key: str = "per_client") -> bool:
    """``per_client.png``: each method's clients' accuracies at the final round (all seeds pooled); False when no
    run recorded per-client results."""
    from fedblend.figures import common_setting, final_client_accuracies, plot_client_distribution

    groups = [(r["legend"], final_client_accuracies(r["dirs"], key), r["n"]) for r in rows]
    groups = [g for g in groups if g[1]]
    if not groups:
        return False
    plot_client_distribution(groups, path, common_setting([r["_config"] for r in rows]), key)
    return True


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


def report(paths: list[str | Path], out_dir: str | Path | None = None, plots: bool = True,
           compare: tuple[str, str] | None = None, band: str = "std",
           acc_range: tuple[float, float] | None = None) -> str:
    if acc_range is not None:
        low, high = acc_range
        if not 0.0 <= low < high <= 100.0:
            raise ConfigError(f"--acc-range must be LOW HIGH in percent with 0 <= LOW < HIGH <= 100, got {low:g} "
                              f"{high:g} (e.g. --acc-range 95 100)")
    runs = find_runs(paths)
    skipped: list[str] = []
    rows, pending = aggregate(runs, skipped=skipped), unfinished(runs)
    if not rows and not pending:
        if skipped:  # nothing left to report: what was left out, and why, is the error
            raise UserFileError("; ".join(skipped))
        raise ConfigError(f"no runs found under {[str(p) for p in paths]}")
    table = markdown_table(rows) + notes(rows, pending, skipped)
    cmp = None
    if compare:
        cmp = paired_differences(find_group(rows, compare[0]), find_group(rows, compare[1]))
        cmp.update(a_label=cmp["a"], b_label=cmp["b"], a=compare[0], b=compare[1])  # the names as given
        note = few_seeds_note(len(cmp["seeds"]), cmp["level"])
        if note:
            warnings.warn(f"--compare {compare[0]} {compare[1]}: {note}", RuntimeWarning, stacklevel=2)
    text = table + (compare_text(cmp) if cmp else "")
    if out_dir is not None:
        with DirLock(out_dir, "report folder"):
            _write_report(Path(out_dir), table, rows, pending, cmp, plots, band, acc_range)
    return text


def _write_report(out: Path, table: str, rows: list[dict], pending: list[dict], cmp: dict | None, plots: bool,
                  band: str = "std", acc_range: tuple[float, float] | None = None) -> None:
    """The report's files in ``out`` (locked by the caller); a run directory is refused (its accuracy.png)."""
    if _is_run(out) or (out / "config.toml").exists() or (out / "checkpoint.pt").exists():
        raise ConfigError(f"report --out {out} is a run directory; write the report to a folder of its own")
    (out / "table.md").write_text(table)
    (out / "table.csv").write_text(csv_table(rows))
    (out / "table.tex").write_text(latex_table(rows))
    (out / "table.json").write_text(dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                                          indent=2))
    (out / "unfinished.json").write_text(dumps(pending, indent=2))
    if cmp:
        (out / "compare.json").write_text(dumps(cmp, indent=2))
        (out / "compare.md").write_text(compare_text(cmp))
    if plots and rows:
        try:
            pyplot("the report's figures")
        except MissingPackageError as exc:  # the tables are written; the figures are what is missing
            warnings.warn(f"no figures: {exc} (or --no-plots)", RuntimeWarning, stacklevel=3)
            return
        plot_curves(rows, out / "accuracy.png", "acc", band, acc_range=acc_range)
        if any(r["global_best"] != "-" for r in rows):
            plot_curves(rows, out / "global_accuracy.png", "global_acc", band, acc_range=acc_range)
        plot_per_client(rows, out / "per_client.png")
