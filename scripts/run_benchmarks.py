"""Run benchmark configs over seeds, several processes at once, then print the report table.

    python scripts/run_benchmarks.py configs/benchmarks/t1-fmnist-*-fedavg-ft.toml --seeds 0 1 2 \
        --jobs 2 --out results/t1 [--set rounds=50] [--data-dir ../shared/data]

Each run is ``fedblend run CONFIG --set seed=S --out OUT/<config-stem>/seed<S> --threads 1``; finished runs
(summary.json present) are skipped and interrupted ones resume from their checkpoint, so the script can be
re-run after an interruption.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/benchmarks")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    jobs = []
    for cfg in args.configs:
        for seed in args.seeds:
            out = Path(args.out) / Path(cfg).stem / f"seed{seed}"
            if (out / "summary.json").exists():
                continue
            cmd = [sys.executable, "-m", "fedblend.cli.main", "run", cfg, "--set", f"seed={seed}", "--out", str(out),
                   "--threads", str(args.threads), "--quiet"]
            cmd += [x for o in args.overrides for x in ("--set", o)]
            if args.data_dir:
                cmd += ["--data-dir", args.data_dir]
            resume = (out / "checkpoint.pt").exists()
            jobs.append((cmd + (["--resume"] if resume else []), out))

    def run(job: tuple[list[str], Path]) -> int:
        cmd, out = job
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(out / "stdout.log", "a") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"[{'ok' if rc == 0 else f'FAILED rc={rc}'}] {out} ({time.time() - t0:.0f}s)", flush=True)
        return rc

    with ThreadPoolExecutor(args.jobs) as pool:
        rcs = list(pool.map(run, jobs))
    from fedblend.cli.report import report

    print(report([args.out], Path(args.out) / "report"))
    return max(rcs, default=0)


if __name__ == "__main__":
    sys.exit(main())
