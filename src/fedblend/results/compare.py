"""``--compare A B``: paired per-seed differences A - B between two rows of the table.

Best and final accuracy (in points) over the seeds both groups have, with the mean difference, its Student-t
confidence interval and the paired t-test's p-value (:func:`~fedblend.results.stats.paired_stats`); where both
groups' runs set the same ``eval.target``, the rounds to that target are paired too. A group is named by its
label, ``label@hash``, its sweep folder, its method, or a unique part of its label (:func:`find_group`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common.errors import ConfigError
from fedblend.results.stats import few_seeds_note, paired_stats
from fedblend.results.table import COMPARED


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
