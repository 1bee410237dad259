"""The speed table of the GPU-speed issue, in one run: seconds per round of each config under the sequential and
the vmap backend (``fedblend bench --backends sequential,vmap``: interleaved rounds, rounds 2+ averaged), with the
device's measured float32 peak and the fraction of it each backend reaches, written to ``OUT/speed.json``.

    python bookkeeping/gpu_speed.py results/gpu/<device>-<date> [--device cuda] [--rounds 3] [--configs A.toml ...]

Run it first whenever a GPU is lent (about 3 minutes on one H100 with the default configs). On a CPU it runs as
well (``--device cpu``), which is how it is tested; the default configs then take long, so name small ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from fedblend.bench import compare_backends  # noqa: E402
from fedblend.config import load_config  # noqa: E402

#: the issue's table: T1 FedAvg / FedAPA / FedALA, T3 FedAvg, the 1,000-client scale config, and the CPU proxy
CONFIGS = ["configs/benchmarks/t1-fmnist-dir-fedavg.toml", "configs/benchmarks/t1-fmnist-dir-fedapa.toml",
           "configs/benchmarks/t1-fmnist-dir-fedala.toml", "configs/benchmarks/t3-mnist-pat-fedavg.toml",
           "configs/scale/mnist-dir-1000-fedavg.toml", "configs/bench/proxy-mlp-fedavg.toml"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder for speed.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="torch CPU threads (the issue's table: 4)")
    ap.add_argument("--backends", default="sequential,vmap")
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for path in args.configs:
        cfg = load_config(path, [f'device="{args.device}"', "store=\"memory\""])
        res = compare_backends(cfg, args.backends.split(","), args.rounds, args.data_dir)
        res["config_file"] = path
        rows.append(res)
        cells = "  ".join(f"{b} {v['train_s_per_round']:.3f} s (+eval {v['eval_s']:.3f} s, "
                          f"{100 * v['fraction_of_peak']:.2f}% of peak, acc {v['accuracy']:.4f})"
                          for b, v in res["backends"].items())
        print(f"{Path(path).stem}: {cells}", flush=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    doc = {"date": dt.date.today().isoformat(), "device": name, "torch": torch.__version__,
           "cuda": torch.version.cuda, "threads": args.threads, "rounds": args.rounds,
           "seconds": time.perf_counter() - t0, "configs": rows}
    (out / "speed.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'speed.json'} ({doc['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
