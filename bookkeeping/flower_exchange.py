"""Where a Flower exchange's time goes, at Flower's pace and at fedblend's (issue #24): one command, one table.

    python bookkeeping/flower_exchange.py --out runs/flower-exchange [--rounds 2] [--nodes 2] [--repeats 1]

The issue's loopback config (Fashion-MNIST, 4 clients, MNIST-NN, FedAvg, 2 rounds, every client every round,
2 SuperNodes: real SuperLink / SuperNode processes, ``fedblend.flower.deploy.deploy_local``) is deployed twice
per repeat, alternating:

* ``flower``: the ServerApp pulls replies every 3 s (what Flower's ``Grid.send_and_receive`` does) and the
  SuperExecs look for work every 1 s (Flower's default ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``);
* ``fedblend``: fedblend's defaults, pulls every 0.2 s and SuperExec polls every 0.1 s.

For every exchange (``flower_exchanges`` in metrics.jsonl) it splits the wall time the ServerApp saw into the
node's parts, per node, then the slowest node: ``process`` (the ClientApp process's age when fedblend's handler
started: interpreter, imports of flwr / torch / fedblend, Flower's setup), ``load`` (the node loading its
clients from its cache), ``work`` (the clients' training or evaluation) and the rest (Flower's transport and
polls: SuperLink -> SuperNode -> SuperExec -> ClientApp and back). It also times the imports alone in fresh
interpreters (``python -c "import torch"`` ...). Prints markdown tables and writes OUT/exchange.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fedblend.config import load_config
from fedblend.flower.deploy import deploy_local

CONFIG = ["dataset='fmnist'", "model='mlp'", "method='fedavg'", "seed=0", "checkpoint_every=0",
          "partition.kind='dirichlet'", "partition.alpha=0.1", "partition.rule='fedapa'", "partition.num_clients=4",
          "partition.split='official'", "train.lr=0.05", "train.batch_size=64", "sampling.join_ratio=1.0",
          "log.plot=false"]
PACES = {"flower": {"poll": 3.0, "superexec_poll": 1.0}, "fedblend": {"poll": 0.2, "superexec_poll": 0.1}}
IMPORTS = ("torch", "flwr.clientapp", "fedblend.flower.apps")


def import_seconds(repeats: int = 3) -> dict[str, float]:
    """Median wall seconds of a fresh interpreter importing each of ``IMPORTS`` in turn (cumulative: each row
    adds the next import to the ones before it), and of the bare interpreter."""
    out = {}
    stmts = [("python", "pass")]
    for i, mod in enumerate(IMPORTS):
        stmts.append((f"+ {mod}", "; ".join(f"import {m}" for m in IMPORTS[: i + 1])))
    for label, stmt in stmts:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", stmt], check=True)
            times.append(time.perf_counter() - t0)
        out[label] = statistics.median(times)
    return out


def exchanges(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    found = []
    for row in rows:
        for ex in row.get("flower_exchanges", []):
            nodes = list(ex["nodes"].values())
            slowest = max(nodes, key=lambda n: n.get("process_age", 0) + n["node_load"] + n["work"])
            found.append({"round": row["round"], "phase": ex["phase"], "seconds": ex["seconds"],
                          "process": slowest.get("process_age", 0.0), "load": slowest["node_load"],
                          "work": slowest["work"]})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    base = Path(a.out).resolve()
    cfg = load_config(None, [*CONFIG, f"rounds={a.rounds}"])
    result: dict = {"config": CONFIG + [f"rounds={a.rounds}"], "nodes": a.nodes, "runs": {p: [] for p in PACES}}
    for r in range(a.repeats):
        for pace, knobs in PACES.items():
            out = base / f"{pace}-{r}"
            t0 = time.perf_counter()
            summary = deploy_local(cfg, out, a.nodes, a.data_dir, timeout=600, force=True, run_timeout=3600,
                                   **knobs)
            result["runs"][pace].append({"wall": time.perf_counter() - t0, "exchanges": exchanges(out),
                                         "final_accuracy": summary["final_accuracy"]})
    result["imports"] = import_seconds()
    (base / "exchange.json").write_text(json.dumps(result, indent=1))

    print("| pace | round | exchange | wall s | ClientApp process at entry s | load s | work s | rest (Flower) s |")
    print("|---|---|---|---|---|---|---|---|")
    for pace, runs in result["runs"].items():
        for run in runs:
            for e in run["exchanges"]:
                rest = e["seconds"] - e["process"] - e["load"] - e["work"]
                print(f"| {pace} | {e['round']} | {e['phase']} | {e['seconds']:.2f} | {e['process']:.2f} | "
                      f"{e['load']:.3f} | {e['work']:.3f} | {rest:.2f} |")
    means = {p: statistics.mean(e["seconds"] for run in runs for e in run["exchanges"])
             for p, runs in result["runs"].items()}
    print(f"\nmean seconds per exchange: flower pace {means['flower']:.2f}, fedblend {means['fedblend']:.2f}, "
          f"ratio {means['flower'] / means['fedblend']:.2f}x; runs' final accuracy equal: "
          f"{len({run['final_accuracy'] for runs in result['runs'].values() for run in runs}) == 1}")
    print("\n| fresh interpreter | seconds (cumulative) |\n|---|---|")
    for label, sec in result["imports"].items():
        print(f"| {label} | {sec:.2f} |")


if __name__ == "__main__":
    main()
