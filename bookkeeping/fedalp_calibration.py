"""T2 (FedALP Table 2) budget probe from finished 600-round runs: how much of the gap to the paper a different
round budget or a different headline (final instead of best round) explains.

For each dataset it finds, per seed, the first evaluated round N at which FedAvg on the IID split reaches the
paper's IID number, and reports non-IID FedAvg's best accuracy up to that round beside the paper's non-IID
number. It also prints best, best-up-to-N and final accuracy for every row. Reads the directory layout of
``bookkeeping/run_benchmarks.py`` (``ROOT/<config name>/seed<k>/metrics.jsonl``).

    python bookkeeping/fedalp_calibration.py /work/bench/t2
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedblend.results.runs import read_metrics

PAPER = {  # FedALP Table 2, MNIST-NN: FedAvg non-IID, FedALP global, FedALP local, FedAvg IID
    "mnist": {"fedavg": 87.25, "fedalp_global": 86.65, "fedalp_local": 94.46, "iid": 94.37},
    "fmnist": {"fedavg": 73.48, "fedalp_global": 72.81, "fedalp_local": 96.64, "iid": 81.05},
}


def evaluations(run: Path) -> list[dict]:
    rows = read_metrics(run)
    return [r for r in rows if "acc" in r]


def fmt(values: list[float]) -> str:
    mean = 100 * statistics.mean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--budgets", type=int, nargs="+", default=[200, 300, 400, 600])
    args = ap.parse_args(argv)
    for ds, paper in PAPER.items():
        rows = {"fedavg": ("acc",), "fedavg-iid": ("acc",), "fedalp": ("global_acc", "acc")}
        for row, keys in rows.items():
            seeds = sorted((args.root / f"t2-{ds}-mlp-{row}").glob("seed*"))
            if not seeds:
                continue
            runs = [evaluations(s) for s in seeds]
            for key in keys:
                cells = [f"best<={n}: " + fmt([max(e[key] for e in r if e["round"] <= n) for r in runs])
                         for n in args.budgets]
                cells.append("final: " + fmt([r[-1][key] for r in runs]))
                print(f"{ds:6s} {row:10s} {key:10s} " + " | ".join(cells))
        iid_dir, non_dir = args.root / f"t2-{ds}-mlp-fedavg-iid", args.root / f"t2-{ds}-mlp-fedavg"
        if not (iid_dir.exists() and non_dir.exists()):
            continue
        target = paper["iid"] / 100
        for seed_dir in sorted(iid_dir.glob("seed*")):
            iid = evaluations(seed_dir)
            hit = next((e["round"] for e in iid if e["acc"] >= target), None)
            if hit is None:
                print(f"{ds} {seed_dir.name}: IID never reaches {paper['iid']}")
                continue
            non = evaluations(non_dir / seed_dir.name)
            best = max(e["acc"] for e in non if e["round"] <= hit)
            print(f"{ds} {seed_dir.name}: IID reaches the paper's {paper['iid']} at round {hit}; "
                  f"non-IID FedAvg best up to then {100 * best:.2f} (paper {paper['fedavg']})")


if __name__ == "__main__":
    main()
