"""``fedblend report``: the command over the results library (:mod:`fedblend.results`).

The table, ``--compare``, the curves and the written files are :func:`fedblend.results.report.report`'s;
``--diagnostics`` adds each run's method diagnostics (:mod:`fedblend.results.diagnostics`). This module only maps
the command's flags onto it (``fedblend sweep`` calls the library for its closing report).
"""

from __future__ import annotations

import argparse

from fedblend.results.report import report


def run_report(args: argparse.Namespace) -> int:
    """``fedblend report``'s flags -> the report, printed."""
    print(report(args.runs, args.out, plots=not args.no_plots, compare=args.compare, band=args.band,
                 acc_range=args.acc_range, diagnostics=args.diagnostics), end="")
    return 0
