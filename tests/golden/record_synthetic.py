"""Record the shared suite's synthetic runs as golden histories (run once, before a refactor of the seam).

    python tests/golden/record_synthetic.py tests/golden/synthetic.json

Every registered method and method+transform runs two cases on the 4-client synthetic federation: full
participation (4 rounds, seed 1) and partial participation with momentum kept across rounds (join ratio 0.5,
3 rounds, seed 2, momentum 0.5, ``optimizer_state = "keep"``). The history without wall-clock fields is stored;
``tests/test_golden.py`` checks that the current code reproduces every number exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CASES = {
    "full": {"rounds": 4, "seed": 1},
    "partial-keep": {"rounds": 3, "seed": 2, "join_ratio": 0.5, "momentum": 0.5, "optimizer_state": "keep"},
}


def main(out: str) -> None:
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.synthetic import make_synthetic
    from tests.helpers import tiny_sim, without_timings
    from tests.test_shared_suite import SPECS

    torch.set_num_threads(1)
    fed = build_federated(make_synthetic(), PartitionSpec(kind="dirichlet", alpha=1.0, num_clients=4, min_samples=5,
                                                          split="merge"), seed=0)  # the suite's tiny_fed
    result = {}
    for spec in SPECS:
        for case, kw in CASES.items():
            sim = tiny_sim(fed, spec, **kw)
            sim.run()
            result[f"{spec}/{case}"] = json.loads(json.dumps(without_timings(sim.history)))
    Path(out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(result)} histories to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
