"""FedRep probe: ``fedblend run`` with each client's two phases logged (docs/methods/fedrep.md, the T3 collapse).

For every client and round, after its head phase (Alg. 1 line 6) and its representation phase (line 7): the phase's
mean loss, the norm of every tensor of the model it returns, and whether every tensor is finite, one JSON line each
in ``OUT/phases.jsonl`` (``round`` 1-based, as metrics.jsonl). The run itself is
unchanged (the wrapper only reads what each phase returns), so its metrics equal a plain ``fedblend run``'s.

    python bookkeeping/fedrep_phases.py configs/benchmarks/t3-mnist-pat-fedavg.toml --out DIR \\
        --set method=fedrep --set options.head_epochs=1 --set rounds=7 --threads 1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import fedblend.algorithms.fedrep as fedrep
from fedblend.cli.main import main as fedblend_main


def logged(log_path: Path):
    """FedRep's ``local_training`` with one log line per finished phase."""
    original = fedrep.FedRep.local_training

    def local_training(self, params, msg, cstate, ctx):
        work = original(self, params, msg, cstate, ctx)
        phases = iter(("head", "body"))
        try:
            spec = next(work)
            while True:
                res = yield spec
                p = res.params
                with log_path.open("a") as f:
                    f.write(json.dumps({"round": ctx.rnd + 1, "cid": ctx.cid, "phase": next(phases),
                                        "loss": res.mean_loss, "norms": {n: float(v.norm()) for n, v in p.items()},
                                        "finite": all(bool(torch.isfinite(v).all()) for v in p.values())}) + "\n")
                spec = work.send(res)
        except StopIteration as done:
            return done.value

    return local_training


def main(argv: list[str]) -> int:
    if "--out" not in argv:
        print("usage: fedrep_phases.py CONFIG --out DIR [fedblend run options]", file=sys.stderr)
        return 2
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    log = out / "phases.jsonl"
    log.unlink(missing_ok=True)
    fedrep.FedRep.local_training = logged(log)
    return fedblend_main(["run", *argv, "--force"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
