"""Results are data, figures are generated: draw the benchmark figures of the docs from the runs under ``results/``.

Each figure names its image, the results folders it averages (one curve per folder: every ``seed*`` run in it,
mean ± sample std over seeds, the seed count in the legend) and the metric. The curves and the title come from
``fedblend report``'s plotting (:func:`fedblend.results.curves.curves_figure`), so a figure in the docs looks like
one a user's ``fedblend report`` draws; the only difference is the grouping, by folder here (a folder's seeds
were run from configs that differ in their ``name`` alone, which ``report`` would keep apart).

    python bookkeeping/figures.py            # redraw every figure from results/
    python bookkeeping/figures.py --list     # what each figure averages, and how many seeds each folder has now

Run it after ``python bookkeeping/tables.py`` whenever the campaign adds seeds to a folder a figure reads.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fedblend.results.curves import plot_curves
from fedblend.results.runs import find_runs
from fedblend.results.table import aggregate

REPO = Path(__file__).resolve().parents[1]
T1_SETTING = "FMNIST, 20 clients (0.6-1 join), LeNet-5, 50 rounds (T1: FedAPA Table 1)"
T4_ROWS = (("pfedrlla", "pFedRLLA"), ("pfedrlla-pretrained", "pFedRLLA, pre-trained agent"),
           ("pfedrlla-transfer", "pFedRLLA, agent from FMNIST s = 4"), ("fedphp", "FedPHP"),
           ("fedavg-ft", "FedAvg-FT"), ("fedala", "FedALA"), ("fedbabu", "FedBABU"), ("ditto", "Ditto"),
           ("local", "Local-only"), ("apfl", "APFL"), ("fedavg", "FedAvg"))


def t4_curves(column: str, repo: Path | None = None) -> tuple[tuple[str, str], ...]:
    """The T4 column's rows that have runs (pFedRLLA Fig. 4, test accuracy trajectories): the campaign fills the
    column one row at a time, and the figure draws what ``results/t4/COLUMN`` holds."""
    base = (repo or REPO) / "results/t4" / column
    return tuple((f"results/t4/{column}/{row}", legend) for row, legend in T4_ROWS
                 if any((base / row).glob("seed*/summary.json")))


@dataclass(frozen=True)
class Figure:
    image: str  # relative to the repository
    curves: tuple[tuple[str, str], ...]  # (results folder, legend)
    key: str = "acc"  # the metric: "acc" (personalized) or "global_acc" (the global model)
    setting: str | None = None  # the title's setting, when the curves' settings differ
    acc_range: tuple[float, float] | None = None  # zoom the accuracy axis (%)
    t4_colours: bool = False  # each T4 row in its own colour, the same in every T4 figure (its place in T4_ROWS)


FIGURES = (
    Figure("docs/img/t1-dir-sweep-accuracy.png",
           (("results/t1/dir/fedapa", "FedAPA"), ("results/t1/dir/fedala", "FedALA"))),
    Figure("docs/img/t1-fedavg-global.png",
           (("results/t1/pat/fedavg-ft", "FedAvg, pathological"), ("results/t1/dir/fedavg-ft", "FedAvg, Dir(0.1)")),
           key="global_acc", setting=T1_SETTING),
    Figure("docs/img/t1-fedavg-ft-local.png",
           (("results/t1/pat/fedavg-ft", "FedAvg-FT, pathological"), ("results/t1/pat/local", "Local, pathological"),
            ("results/t1/dir/fedavg-ft", "FedAvg-FT, Dir(0.1)"), ("results/t1/dir/local", "Local, Dir(0.1)")),
           setting=T1_SETTING),
    Figure("docs/img/t4-fmnist-pat2-accuracy.png", t4_curves("fmnist-pat2"),
           setting="FMNIST pathological s = 2, 100 clients (10 % join), 4-layer CNN, 100 rounds (T4)",
           t4_colours=True),
    Figure("docs/img/t4-fmnist-pat2-accuracy-top.png",
           tuple(c for c in t4_curves("fmnist-pat2") if not c[0].endswith(("/fedavg", "/apfl"))),
           setting="FMNIST pathological s = 2, T4, the rows above 95 % (FedAvg and APFL left out)",
           acc_range=(95.0, 100.0), t4_colours=True),
    Figure("docs/img/t4-mnist-domains-accuracy.png", t4_curves("mnist-domains"),
           setting="MNIST* (MNIST / USPS / mnist-texture), 100 clients (10 % join), 4-layer CNN, 100 rounds (T4)",
           t4_colours=True),
    Figure("docs/img/t4-mnist-domains-accuracy-top.png",
           tuple(c for c in t4_curves("mnist-domains") if "/pfedrlla" not in c[0] and not c[0].endswith("/local")),
           setting="MNIST*, T4, the baselines (pFedRLLA's rows and Local-only left out), accuracy axis from 88 %",
           acc_range=(88.0, 97.0), t4_colours=True),
    Figure("docs/img/t4-fmnist-dir0.1-accuracy.png", t4_curves("fmnist-dir0.1"),
           setting="FMNIST Dir(0.1), 100 clients (10 % join), 4-layer CNN, 100 rounds (T4)", t4_colours=True),
    # the probes of what pFedRLLA's K' stores (Alg. 1 leaves it open), between FedAvg and training alone
    Figure("docs/img/t4-mnist-domains-storage.png",
           (("results/probes/t4/mnist-domains/pfedrlla-storage-trained", "pFedRLLA, K' = trained models (authors)"),
            ("results/t4/mnist-domains/pfedrlla", "pFedRLLA, K' = uploads (paper, default)"),
            ("results/probes/t4/mnist-domains/pfedrlla-storage-aggregated", "pFedRLLA, K' = models sent"),
            ("results/t4/mnist-domains/fedavg", "FedAvg"), ("results/t4/mnist-domains/local", "Local-only")),
           setting="MNIST*, T4: what pFedRLLA's K' stores (options.storage; probes, seed 0)"),
)


def rows_of(fig: Figure, repo: Path = REPO) -> list[dict]:
    """One report row per curve: every finished run of the folder, whatever its config's name."""
    rows = []
    for folder, legend in fig.curves:
        got = aggregate(find_runs([repo / folder]), key=lambda s, legend=legend: (legend, "-"))
        if not got:
            raise SystemExit(f"figures: {folder} holds no finished run (needed by {fig.image})")
        (row,) = got
        row["legend"] = legend
        if fig.t4_colours:
            row["slot"] = [k for k, _ in T4_ROWS].index(Path(folder).name)
        rows.append(row)
    return rows


def draw(fig: Figure, repo: Path = REPO) -> Path:
    out = repo / fig.image
    plot_curves(rows_of(fig, repo), out, key=fig.key, setting=fig.setting, acc_range=fig.acc_range)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="list the figures and their folders' seeds; draw nothing")
    args = ap.parse_args(argv)
    for fig in FIGURES:
        if args.list:
            print(fig.image)
            for row in rows_of(fig):
                print(f"  {row['legend']}: seeds {row['seeds']}")
        else:
            print(draw(fig).relative_to(REPO))
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly, as for any Unix tool
    sys.exit(main())
