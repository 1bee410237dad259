"""Run benchmark configs over seeds, several processes at once, then print the report table.

A thin wrapper over ``fedblend sweep`` (kept so older commands keep working; use the command directly)::

    python bookkeeping/run_benchmarks.py configs/benchmarks/t1-fmnist-*-fedavg-ft.toml --seeds 0 1 2 \
        --jobs 2 --out results/t1 [--set rounds=50] [--data-dir ../shared/data]

is ``fedblend sweep ... --jobs 2 --threads 1 --out results/t1``: each run goes to ``OUT/<config-stem>/seed<S>``,
finished runs are skipped and interrupted ones resume from their checkpoint, so it can be re-run after an
interruption. The defaults differ from the command's: seeds 0 1 2, two jobs, ``--out results/benchmarks``.
"""

from __future__ import annotations

import argparse
import sys

from fedblend.cli.main import main as fedblend_main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--out", default="results/benchmarks")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--data-dir")
    args = ap.parse_args(argv)
    cmd = ["sweep", *args.configs, "--seeds", *args.seeds, "--jobs", args.jobs, "--threads", args.threads,
           "--out", args.out, *[x for o in args.overrides for x in ("--set", o)]]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    return fedblend_main(cmd)


if __name__ == "__main__":
    sys.exit(main())
