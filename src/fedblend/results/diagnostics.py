"""``fedblend report RUNS --diagnostics``: each run's method diagnostics, drawn.

A method registers what it shows of a run (:func:`fedblend.core.diagnostics.register_diagnostics`: FedAPA its aggregation
weights, ALA its learned weights and its time share); here each run's method is built from its resolved config,
every diagnostic registered for it is called, and the items are drawn into ``DIR/<run>/<item>.png`` (``DIR`` is
``OUT/diagnostics`` of ``report --out OUT``; without it nothing is drawn and the numbers are printed):

* :class:`~fedblend.core.diagnostics.ClientWeights` -- a heatmap (:func:`~fedblend.results.heatmaps.save_heatmap`)
  and, with the run's ``partition.json``, the share of the off-diagonal weight that goes to clients sharing a
  class (:func:`~fedblend.results.heatmaps.same_class_mass`);
* :class:`~fedblend.core.diagnostics.Histogram`, :class:`~fedblend.core.diagnostics.Curves` -- one panel each;
* :class:`~fedblend.core.diagnostics.Numbers` -- printed.

Every number is also written to ``DIR/<run>/diagnostics.json``. A run whose method cannot be built here (a
plug-in that is not installed, a config this version refuses) or whose files a diagnostic cannot read gets one
line saying so, and the other runs go on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedblend.common.errors import FedblendError
from fedblend.common.jsonio import dumps, read_json_object
from fedblend.common.optional import pyplot
from fedblend.config import config_from_dict
from fedblend.core.diagnostics import ClientWeights, Curves, Histogram, Item, Numbers, RunFiles, diagnostics_of
from fedblend.results.figures import integer_rounds
from fedblend.results.heatmaps import same_class_mass, save_heatmap
from fedblend.results.names import method_name
from fedblend.results.runs import find_runs, read_metrics, run_config


def run_items(run: Path) -> tuple[str, list[Item] | None]:
    """The run's method spec and what its diagnostics return (None: its method registered none); a
    :class:`FedblendError` naming the run when its method cannot be built from its config."""
    cfg = run_config(run)
    if not cfg.get("method"):
        raise FedblendError(f"{run}: no config (summary.json or config.toml) to build its method from")
    try:
        method = config_from_dict(cfg).build_method()
    except (FedblendError, ValueError, TypeError) as exc:
        raise FedblendError(f"{run}: its method {cfg['method']!r} cannot be built here: {exc}") from exc
    found = diagnostics_of(method)
    if not found:
        return cfg["method"], None
    files = RunFiles(run, method, read_metrics(run))
    return cfg["method"], [item for fn in found for item in fn(files)]


def diagnostics(paths: list[str | Path], out_dir: str | Path | None = None) -> str:
    """The diagnostics of every run under ``paths`` as text; figures and ``diagnostics.json`` written to
    ``out_dir/<run>/`` when ``out_dir`` is given (the caller holds its lock). Runs whose method registered no
    diagnostic are counted in one line at the end."""
    runs = find_runs(paths)
    lines, without = ["", "diagnostics:"], {}
    for run, name in zip(runs, run_names(runs)):
        try:
            spec, items = run_items(run)
        except (FedblendError, OSError) as exc:
            lines.append(f"{run}: skipped ({exc})")
            continue
        if items is None:
            without[spec] = without.get(spec, 0) + 1
            continue
        lines.append(f"{run} ({method_name(spec)}):" + ("" if items else " nothing to show (no checkpoint.pt?)"))
        lines += _render_run(items, run, Path(out_dir) / name if out_dir is not None else None)
    if without:
        lines.append(f"no diagnostics registered: {sum(without.values())} run(s) of "
                     f"{', '.join(method_name(s) for s in sorted(without))}")
    if out_dir is None:
        lines.append("(figures: report --out DIR --diagnostics writes them to DIR/diagnostics)")
    return "\n".join(lines) + "\n"


def _render_run(items: list[Item], run: Path, folder: Path | None) -> list[str]:
    """Draw a run's items into ``folder`` (when given), its numbers into ``diagnostics.json``; the lines to print."""
    lines, numbers = [], {}
    for item in items:
        shown, values = render(item, run, folder)
        lines.append(f"  {shown}")
        if values:
            numbers[item.name] = values
    if folder is not None and numbers:
        (folder / "diagnostics.json").write_text(dumps(numbers, indent=2))
    return lines


def run_names(runs: list[Path]) -> list[str]:
    """A folder name per run: its directory's name, or its path below the runs' common folder joined by ``__``
    where two runs share a name."""
    plain = [r.name for r in runs]
    if len(set(plain)) == len(plain):
        return plain
    parts = [r.resolve().parts for r in runs]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    return ["__".join(p[common:]) for p in parts]


def render(item: Item, run: Path, folder: Path | None) -> tuple[str, dict[str, Any] | None]:
    """Draw ``item`` into ``folder`` (when given): a line to print and the numbers it holds (None: none)."""
    values = None
    if isinstance(item, Numbers):
        values = dict(item.values)
    elif isinstance(item, ClientWeights):
        counts = _train_counts(run)
        values = same_class_mass(item.matrix, counts) if counts is not None else None
    if folder is None or isinstance(item, Numbers):
        return f"{item.name}: {dumps(values) if values else '(a figure)'}", values
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{item.name}.png"
    if isinstance(item, ClientWeights):
        save_heatmap(item.matrix, path, item.title)
    else:
        draw_panel(item, path)
    return f"wrote {path}" + (f"  {dumps(values)}" if values else ""), values


def _train_counts(run: Path) -> list | None:
    path = run / "partition.json"
    if not path.exists():
        return None
    counts = read_json_object(path, "it is the run's partition, written by fedblend").get("train_counts")
    return counts if isinstance(counts, list) else None


def draw_panel(item: Histogram | Curves, path: Path) -> Path:
    """One :class:`Histogram` or :class:`Curves` as a PNG (rounds on whole-number ticks; an empty panel says
    what is missing instead of staying blank)."""
    plt = pyplot("the diagnostics")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if isinstance(item, Histogram):
        ax.hist(item.values.detach().cpu().float().numpy(), bins=50, range=item.range, color="tab:blue")
        ax.set_yscale("log" if item.log else "linear")
        ax.set_title(f"{item.title}\n({item.values.numel()} values)", fontsize=10)
        ax.set_xlabel(item.xlabel)
        ax.set_ylabel("count")
    else:
        _draw_curves(ax, item)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw_curves(ax, item: Curves) -> None:
    drawn = False
    for line in item.thin:
        ax.plot(*zip(*line), color="grey", lw=0.5, alpha=0.5)
        drawn = True
    if item.band and item.band[1]:
        r, lo, hi = zip(*item.band[1])
        ax.fill_between(r, lo, hi, alpha=0.3, label=item.band[0])
    for label, pts in item.lines.items():
        if pts:
            ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=label)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, item.empty, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35")
    elif len(item.lines) > 1 or item.band:
        ax.legend(fontsize=8)
    if item.ylim:
        ax.set_ylim(*item.ylim)
    ax.set_title(item.title, fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel(item.ylabel)
    integer_rounds(ax)
    ax.grid(alpha=0.3)
