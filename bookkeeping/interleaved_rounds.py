"""Two configs' rounds (training + evaluation) timed alternately in one process, on the same data.

    python bookkeeping/interleaved_rounds.py configs/benchmarks/t3-mnist-pat-fedavg.toml \\
        configs/benchmarks/t3-mnist-pat-fedala.toml --rounds 5 --threads 2

Interleaving removes the between-process noise of timing two runs separately (both see the same machine state
round by round). Prints one JSON row per round and the mean seconds per round after the first (``--skip``)
rounds of each config and their ratio (second / first). The configs must share dataset and partition.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fedblend.config import load_config
from fedblend.experiment import build_data, create_simulation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip", type=int, default=1, help="leading rounds left out of the means (initial stages)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfgs = [load_config(args.first), load_config(args.second)]
    if (cfgs[0].dataset, cfgs[0].partition) != (cfgs[1].dataset, cfgs[1].partition):
        raise SystemExit("the two configs must share dataset and partition")
    fed = build_data(cfgs[0], args.data_dir)
    sims = [create_simulation(c, fed, rounds=args.rounds) for c in cfgs]
    names = [c.label for c in cfgs]
    rows = []
    for r in range(args.rounds):
        row: dict = {"round": r + 1}
        for name, sim in zip(names, sims):
            t0 = time.perf_counter()
            m = sim.run_round()
            row[name] = time.perf_counter() - t0
            row[f"{name}_acc"] = m.get("acc")
        rows.append(row)
        print(json.dumps(row), flush=True)
    kept = rows[args.skip:]
    means = [sum(r[n] for r in kept) / len(kept) for n in names]
    print(json.dumps({"rounds": [r["round"] for r in kept], names[0]: means[0], names[1]: means[1],
                      "ratio_second_over_first": means[1] / means[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
