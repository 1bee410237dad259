"""``fedblend report``: the command over the results library (:mod:`fedblend.results`).

The table, ``--compare``, the curves and the written files are :func:`fedblend.results.report.report`'s;
``--diagnostics`` adds each run's method diagnostics (:mod:`fedblend.results.diagnostics`). This module only maps
the command's flags onto it (``fedblend sweep`` calls the library for its closing report).
"""

from __future__ import annotations

import argparse

from fedblend.cli import args as cli_args
from fedblend.cli import flags
from fedblend.cli.flags import float_in


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help="table (mean ± std over seeds) and accuracy curves of runs")
    rep.add_argument("runs", nargs="+", help="run directories or folders containing them")
    rep.add_argument("--out", help="write table.md / .csv / .tex / .json and PNG curves here")
    rep.add_argument("--no-plots", action="store_true")
    rep.add_argument("--compare", nargs=2, metavar=("A", "B"), help="paired per-seed differences A - B with a "
                     "t-interval; A and B name groups (label, method, part of a label, or label@hash)")
    rep.add_argument("--band", choices=["std", "ci"], default="std", help="the curves' band: sample std over seeds "
                     "(default, as the table) or the 95%% t-interval of the mean")
    rep.add_argument("--acc-range", nargs=2, type=float_in(flags.ACC_RANGE), metavar=("LOW", "HIGH"), help="zoom the curves' "
                     "accuracy axis to LOW-HIGH %% (e.g. 95 100 where the rows end close together; the loss axis "
                     "stays whole)")
    rep.add_argument("--diagnostics", action="store_true", help="each run's method diagnostics (FedAPA's "
                     "aggregation weights, ALA's learned weights, ...): printed, drawn into OUT/diagnostics with --out")
    cli_args.debug(rep)


def command(args: argparse.Namespace) -> int:
    """``fedblend report``'s flags -> the report, printed."""
    from fedblend.results.report import report

    print(report(args.runs, args.out, plots=not args.no_plots, compare=args.compare, band=args.band,
                 acc_range=args.acc_range, diagnostics=args.diagnostics), end="")
    return 0
