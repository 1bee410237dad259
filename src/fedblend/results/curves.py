"""The report's curves over seeds: ``accuracy.png`` / ``global_accuracy.png`` (accuracy and loss per round, mean
over seeds with a band, one line per table row, the legend by method) and ``per_client.png``.

The title states the setting and the number of seeds, and the band's meaning: ``"std"`` (± the table's sample std
over seeds, ddof = 1) or ``"ci"`` (the 95% t-interval of the mean, :func:`~fedblend.results.stats.ci_halfwidth`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from fedblend.common.optional import pyplot
from fedblend.results.figures import final_client_accuracies, integer_rounds, plot_client_distribution
from fedblend.results.names import common_setting
from fedblend.results.runs import read_metrics
from fedblend.results.stats import ci_halfwidth, mean_std

LINE_STYLES = ("-", "--", ":", "-.")
LEGEND_INSIDE = 5  # more rows than this: the legend goes below the panels
TITLE_CHARS_PER_INCH = 14  # the title (10 pt) wraps at about this many characters per inch of figure width
BANDS = {"std": "band: ± sample std over seeds (ddof = 1)", "ci": "band: 95% t-interval of the mean over seeds"}


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
    groups = [(r["legend"], final_client_accuracies(r["dirs"], key), r["n"]) for r in rows]
    groups = [g for g in groups if g[1]]
    if not groups:
        return False
    plot_client_distribution(groups, path, common_setting([r["_config"] for r in rows]), key)
    return True
