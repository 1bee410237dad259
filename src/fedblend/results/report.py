"""A report over run directories: the table (mean ± std over seeds), ``--compare``, the curve PNGs; the library behind
``fedblend report`` (:mod:`fedblend.cli.report`), ``fedblend sweep`` and the scripts.

Std is the sample standard deviation over seeds (ddof = 1), in the table and in the plots' bands alike. Runs are
grouped by their label (config ``name``, or dataset-partition-method) and the hash of their resolved config without
its seed (:func:`~fedblend.results.runs.group_key`; the "config" column): every seed of one config becomes one row
with best and final personalized accuracy, global accuracy where a global model exists, and seconds per round. Two
runs of one label with different settings are two rows (the hash tells them apart), and so are runs made with
different files at a path the config names (the hash covers the recorded ``run.inputs`` sha256); a seed that
appears twice in a row is warned about; runs without a finished summary (interrupted, or stopped by a non-finite
update) are listed with their last round instead of being averaged.

``--compare A B`` adds paired per-seed differences A - B (best and final accuracy, in points) over the seeds both
groups have, with the mean difference, its Student-t confidence interval and the paired t-test's p-value
(``scipy.stats``); where both groups' runs set the same ``eval.target``, the rounds to that target are paired too
(in rounds, over the seeds where both reached it; the seeds where a side did not are named). A group is named by
its label, ``label@hash``, its sweep folder, its method, or a unique part of its label. Written files:
``table.md``, ``table.csv``, ``table.tex``, ``table.json``, ``unfinished.json``, ``compare.json`` / ``compare.md``
(with ``--compare``; fewer than 3 paired seeds add a warning that the interval means little), ``accuracy.png``
(accuracy and loss curves side by side, legend by method, the setting and the number of seeds in the title, the
band's meaning stated: ``--band std`` (default) or ``ci``; ``--acc-range LOW HIGH`` zooms the accuracy axis),
``global_accuracy.png`` where a global model exists, ``per_client.png`` (every client's final-round accuracy per
method, seeds pooled) where the runs recorded per-client results, and with ``--diagnostics`` the methods' own
figures (FedAPA's aggregation weights, ALA's learned weights) in ``diagnostics/<run>/``. The table's ``worst client
%`` and ``client p10 %`` are the final round's worst client and 10th percentile, mean ± std over seeds.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from fedblend.common.errors import ConfigError, UserFileError
from fedblend.common.jsonio import dumps
from fedblend.common.optional import MissingPackageError, pyplot
from fedblend.results.compare import compare_text, find_group, paired_differences
from fedblend.results.curves import plot_curves, plot_per_client
from fedblend.results.diagnostics import diagnostics as method_diagnostics
from fedblend.results.runs import find_runs, is_run, unfinished
from fedblend.results.stats import few_seeds_note
from fedblend.results.table import aggregate, csv_table, latex_table, markdown_table, notes
from fedblend.rundir import DirLock


def report(paths: list[str | Path], out_dir: str | Path | None = None, plots: bool = True,
           compare: tuple[str, str] | None = None, band: str = "std",
           acc_range: tuple[float, float] | None = None, diagnostics: bool = False) -> str:
    """The report of the runs under ``paths`` as text (the table, its notes, the comparison, with
    ``diagnostics`` each run's method diagnostics: :mod:`fedblend.results.diagnostics`), its files written to
    ``out_dir`` when given (see the module docstring; the diagnostics' in ``out_dir/diagnostics``); a
    :class:`ConfigError` / :class:`UserFileError` naming what is wrong when nothing can be reported."""
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
    if out_dir is None:
        return text + (method_diagnostics(paths) if diagnostics else "")
    with DirLock(out_dir, "report folder"):
        _write_report(Path(out_dir), table, rows, pending, cmp, plots, band, acc_range)
        if diagnostics:
            text += method_diagnostics(paths, Path(out_dir) / "diagnostics")
    return text


def _write_report(out: Path, table: str, rows: list[dict], pending: list[dict], cmp: dict | None, plots: bool,
                  band: str = "std", acc_range: tuple[float, float] | None = None) -> None:
    """The report's files in ``out`` (locked by the caller); a run directory is refused (its accuracy.png)."""
    if is_run(out) or (out / "config.toml").exists() or (out / "checkpoint.pt").exists():
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
