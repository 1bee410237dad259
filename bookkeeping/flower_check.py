"""Every registered method on a loopback Flower federation vs ``fedblend run`` (issue #14, done-when 1 and 4).

    python bookkeeping/flower_check.py --out runs/flower-check [--nodes 3] [--rounds 2] [--methods fedavg fedala]

For each method: the in-process run (``fedblend run --threads 1``) and the same config submitted with ``flwr run``
to one SuperLink with ``--nodes`` SuperNodes (real processes on loopback, started once for all methods). Writes
OUT/<method>/{sim,flower}/ (the run contract), OUT/check.json and prints a markdown table: per-round accuracies,
whether they are equal bit for bit, seconds per round both ways. Needs the Flower extra and FMNIST in
$FEDBLEND_DATA.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fedblend.algorithms import METHODS
from fedblend.config import load_config
from fedblend.experiment import run_experiment
from fedblend.flower.deploy import CONNECTION, local_federation, write_app

BASE = ["dataset='fmnist'", "model='mlp'", "seed=0", "checkpoint_every=1", "partition.kind='dirichlet'",
        "partition.alpha=0.1", "partition.rule='fedapa'", "partition.num_clients=9", "partition.split='official'",
        "train.lr=0.05", "train.batch_size=64", "sampling.join_ratio=1.0"]


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", nargs="+", default=[*sorted(METHODS), "fedavg+ala"])
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out).resolve()
    rows = []
    with local_federation(out / "federation") as fed:
        fed.start_superlink()
        for k in range(a.nodes):
            fed.start_supernode(k, f'partition-id={k} num-partitions={a.nodes} '
                                   f'state-dir="{out / "federation" / f"node-{k}"}"')
        for method in a.methods:
            cfg = load_config(None, [*BASE, f"rounds={a.rounds}", f"method={method!r}"])
            d = out / method
            t0 = time.perf_counter()
            run_experiment(cfg, d / "sim", a.data_dir, force=True)
            t_sim = time.perf_counter() - t0
            app = write_app(cfg, d / "app", d / "flower", a.data_dir, nodes=a.nodes, timeout=600, force=True)
            t0 = time.perf_counter()
            rc = fed.flwr("run", str(app), CONNECTION, "--stream", timeout=1800, log=f"flwr-run-{method}").returncode
            t_flw = time.perf_counter() - t0
            sim = history(d / "sim")
            flw = history(d / "flower") if (d / "flower" / "metrics.jsonl").exists() else []
            keys = ("acc", "loss", "train_loss", "global_acc", "selected", "bytes_down", "bytes_up")
            equal = len(sim) == len(flw) and all({k: x.get(k) for k in keys} == {k: y.get(k) for k in keys}
                                                 for x, y in zip(sim, flw))
            ss, fs = (json.loads((d / r / "summary.json").read_text()) if (d / r / "summary.json").exists() else {}
                      for r in ("sim", "flower"))
            row = {"method": method, "flwr_exit": rc, "rounds": len(flw), "sim_acc": [m.get("acc") for m in sim],
                   "flower_acc": [m.get("acc") for m in flw], "bit_equal": equal,
                   "faults": [m.get("flower_faults") for m in flw if m.get("flower_faults")],
                   "sim_seconds_per_round": ss.get("seconds_per_round"),
                   "flower_seconds_per_round": fs.get("seconds_per_round"),
                   "sim_wall": t_sim, "flower_wall": t_flw}
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "check.json").write_text(json.dumps(rows, indent=2))
    print("\n| method | rounds | accuracy per round (fedblend run) | accuracy per round (Flower) | bit-equal | "
          "s/round run | s/round Flower |\n|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda v: ", ".join(f"{x:.4f}" for x in v)  # noqa: E731
        print(f"| {r['method']} | {r['rounds']} | {f(r['sim_acc'])} | {f(r['flower_acc'])} | {r['bit_equal']} | "
              f"{r['sim_seconds_per_round']:.2f} | {(r['flower_seconds_per_round'] or float('nan')):.2f} |")


if __name__ == "__main__":
    main()
