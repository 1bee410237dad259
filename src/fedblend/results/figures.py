"""Figures of one run and of clients: titles from the method and setting, stated seeds and bands.

Over run directories (:mod:`fedblend.results.runs`) and their metrics rows; matplotlib is imported only by the
plotting functions (``pip install 'fedblend[plot]'``). Names and setting texts are :mod:`fedblend.results.names`'.

* :func:`plot_run_accuracy` -- a run's ``accuracy.png``: pooled personalized (and global) accuracy per round,
  the clients' 10th-90th percentile band and the worst client, titled by method and setting;
* :func:`plot_client_distribution` -- ``report``'s ``per_client.png``: every client's accuracy at the final
  round, one box per method (all seeds pooled), worst client and 10th percentile marked.
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common.optional import MissingPackageError, pyplot
from fedblend.core.evaluation import client_accuracies
from fedblend.results.names import method_name, setting_text
from fedblend.results.runs import read_metrics, run_config


def _pyplot():
    return pyplot("a figure")


def integer_rounds(ax) -> None:
    """Round numbers on the x axis of ``ax`` as integer ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_run_accuracy(run: Path, path: Path | None = None) -> Path:
    """Write :func:`run_figure` of the run directory ``run`` to ``path`` (default ``run/accuracy.png``)."""
    plt = _pyplot()
    fig = run_figure(run)
    path = Path(path) if path else Path(run) / "accuracy.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def run_figure(run: Path):
    """A run's accuracy per round: pooled personalized test accuracy, the clients' 10th-90th percentile band and
    the worst client (from the rows' ``per_client`` counts), and the global model's where one exists; titled by
    method, setting and seed."""
    plt = _pyplot()
    run = Path(run)
    cfg = run_config(run)
    rows, skipped = evaluated_rows(read_metrics(run))
    for line in skipped:  # one line per round left out, never a traceback
        warnings.warn(f"{run / 'metrics.jsonl'}: {line}: left out of the accuracy figure", RuntimeWarning,
                      stacklevel=2)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    marker = "." if len(rows) < 30 else None
    pts = [(r["round"], 100 * r["acc"]) for r in rows]
    if pts:
        ax.plot(*zip(*pts), marker=marker, color="tab:blue", label="personalized (pooled)")
    per = [(r["round"], _client_accs(r)) for r in rows if r.get("per_client")]
    per = [(t, a) for t, a in per if a]
    if per:
        rr = [t for t, _ in per]
        ax.fill_between(rr, [100 * float(np.percentile(a, 10)) for _, a in per],
                        [100 * float(np.percentile(a, 90)) for _, a in per], color="tab:blue", alpha=0.15,
                        label="clients: 10th-90th percentile")
        ax.plot(rr, [100 * min(a) for _, a in per], ls=":", color="tab:blue", label="worst client")
    gpts = [(r["round"], 100 * r["global_acc"]) for r in rows if _number(r.get("global_acc"))]
    if gpts:
        ax.plot(*zip(*gpts), marker=marker, color="tab:orange", label="global model (pooled)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    n_clients = len(per[-1][1]) if per else 0
    title = method_name(cfg.get("method", "?")) if cfg else run.name
    sub = (setting_text(cfg) + f", seed {cfg.get('seed')}") if cfg else ""
    ax.set_title(f"{title}\n{sub}" if sub else title, fontsize=10)
    if n_clients:
        ax.set_xlabel(f"round   ({n_clients} clients evaluated)")
    integer_rounds(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def evaluated_rows(rows: list) -> tuple[list[dict], list[str]]:
    """The metrics rows a figure can draw -- evaluated rounds (an integer ``round``, a numeric ``acc``) -- and
    one line per evaluated-looking row left out (``"round 3: acc is None, not a number"``); rounds that were not
    evaluated (no ``acc``) are neither."""
    keep, skipped = [], []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "acc" not in r:
            continue
        where = f"round {r['round']}" if isinstance(r.get("round"), int) else f"row {i + 1}"
        if not isinstance(r.get("round"), int):
            skipped.append(f"{where}: round is {r.get('round')!r}, not an integer")
        elif not _number(r["acc"]):
            skipped.append(f"{where}: acc is {r['acc']!r}, not a number")
        else:
            keep.append(r)
    return keep, skipped


def _client_accs(row: dict, key: str = "per_client") -> list[float]:
    """A row's per-client accuracies ([] where its per-client counts are not lists of numbers)."""
    try:
        return list(client_accuracies(row, key).values())
    except (TypeError, AttributeError, ZeroDivisionError):
        return []


def final_client_accuracies(dirs: Sequence[str | Path], key: str = "per_client") -> list[float]:
    """Every client's accuracy at the last evaluated round of each run in ``dirs`` (pooled over the runs)."""
    out: list[float] = []
    for d in dirs:
        rows = [r for r in read_metrics(Path(d)) if isinstance(r, dict) and r.get(key)]
        if rows:
            out += _client_accs(rows[-1], key)
    return out


def plot_client_distribution(groups: Sequence[tuple[str, list[float], int]], path: Path, setting: str | None,
                             key: str = "per_client") -> Path:
    """One box per ``(legend, accuracies, seeds)`` group: every client's final-round accuracy over all seeds
    (whiskers at the extremes), the points themselves, and the 10th percentile marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2.5), 4.6))
    data = [100 * np.asarray(a) for _, a, _ in groups]
    ax.boxplot(data, whis=(0, 100), widths=0.5, showmeans=False, medianprops={"color": "black"})
    rng = np.random.default_rng(0)  # jitter only
    for i, d in enumerate(data, start=1):
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(d)), d, s=9, alpha=0.5, color="tab:blue", zorder=3)
        if len(d):
            p10 = float(np.percentile(d, 10))
            ax.plot([i - 0.3, i + 0.3], [p10, p10], color="tab:red", lw=1.5, zorder=4,
                    label="10th percentile" if i == 1 else None)
    ax.set_xticks(range(1, len(groups) + 1))
    def count(a: list, s: int) -> str:
        if s > 1 and len(a) % s == 0:
            return f"{len(a) // s} clients x {s} seeds"
        return f"{len(a)} clients" + (f", {s} seeds" if s > 1 else ", 1 seed")

    # each label wrapped to its box's width (about 1.4 inches, 8 pt): long legends never run into their neighbours
    ax.set_xticklabels([f"{textwrap.fill(name, 22, break_on_hyphens=False)}\n{count(a, s)}" for name, a, s in groups],
                       fontsize=8)
    who = "global model" if key.startswith("global") else "personalized"
    ax.set_ylabel(f"{who} test accuracy per client (%)")
    ax.set_title("Per-client accuracy at the final round" + (f"\n{setting}" if setting else ""), fontsize=10)
    ax.set_xlabel("box: quartiles; whiskers: worst and best client; points: clients", fontsize=8, color="0.3")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(out: Path) -> Path | None:
    """``OUT/accuracy.png``: personalized accuracy per round with the clients' spread (and the global model's,
    where the method has one), titled by method, setting and seed (:func:`plot_run_accuracy`);
    skipped with a warning when matplotlib is missing (``pip install 'fedblend[plot]'``)."""
    try:
        pyplot("accuracy.png")
    except MissingPackageError as exc:
        warnings.warn(f"no accuracy.png: {exc} (or [log] plot = false)", RuntimeWarning, stacklevel=2)
        return None
    return plot_run_accuracy(out)
