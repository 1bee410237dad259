"""The results library: read run directories, average over seeds, write tables and draw figures.

Used by ``fedblend report`` / ``sweep`` (:mod:`fedblend.cli.report`), the notebook API
(:func:`fedblend.api.open_run`, ``RunResult.plot``), the run itself (its ``accuracy.png``) and the scripts.

* :mod:`~fedblend.results.runs` -- the one reader of run directories (``summary.json``, ``metrics.jsonl``, the
  resolved config), robust to damaged and unfinished runs; :mod:`~fedblend.results.schema` -- what a finished
  run's summary must hold;
* :mod:`~fedblend.results.stats` -- mean ± sample std over seeds, t-intervals, paired differences (scipy.stats);
* :mod:`~fedblend.results.table` -- one row per config over its seeds, as markdown / CSV / LaTeX;
  :mod:`~fedblend.results.compare` -- ``--compare A B``;
* :mod:`~fedblend.results.names` -- display names (each method class's ``display_name``) and setting texts;
* :mod:`~fedblend.results.figures` (one run, clients), :mod:`~fedblend.results.curves` (over seeds),
  :mod:`~fedblend.results.heatmaps` (client weight matrices), :mod:`~fedblend.results.partition` (a partition's
  class counts);
* :mod:`~fedblend.results.diagnostics` -- the methods' own diagnostics (:mod:`fedblend.core.diagnostics`), drawn;
* :mod:`~fedblend.results.report` -- all of it over a set of runs: :func:`report`.

The writer side of a run directory (its lock, what a run owns, ``--force``) stays in :mod:`fedblend.rundir`, next
to the run that writes it (:mod:`fedblend.experiment`).
"""

from fedblend.results.names import display_name, method_name, setting_text
from fedblend.results.report import report
from fedblend.results.runs import find_runs, read_metrics, read_summary, run_config
from fedblend.results.stats import mean_std_cell, paired_stats
from fedblend.results.table import aggregate

__all__ = ["aggregate", "display_name", "find_runs", "mean_std_cell", "method_name", "paired_stats", "read_metrics",
           "read_summary", "report", "run_config", "setting_text"]
