"""Record the shared suite's synthetic runs as golden histories (before a refactor of the seam or the methods).

    python tests/golden/record_synthetic.py tests/golden/synthetic.json          # add the missing specs
    python tests/golden/record_synthetic.py tests/golden/synthetic.json --all    # re-record everything
    python tests/golden/record_synthetic.py /tmp/before.json --check             # bit for bit against a file

A refactor is proven on one machine: record every spec with the old code (``--all`` into a scratch file, from a
checkout of the old commit), then ``--check`` that file with the new code: every history must be reproduced bit
for bit (``tests/test_golden.py`` compares the committed goldens within the cross-machine tolerance).

Every registered method and every method+transform the registry allows (``tests.test_shared_suite.SPECS``) runs
two cases on the 4-client synthetic federation: full participation (4 rounds, seed 1) and partial participation
with momentum kept across rounds (join ratio 0.5, 3 rounds, seed 2, momentum 0.5, ``optimizer_state = "keep"``).
The history without wall-clock fields is stored; ``tests/test_golden.py`` checks that the current code reproduces
every number, and fails for a registered spec without a golden. By default only the missing specs are recorded,
so the histories already there keep the code they were recorded with as their reference. ALA is recorded (and
checked) with ``eval_stream = "eval"``, the protocol of the first goldens.
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


def uses_ala(spec: str) -> bool:
    return spec == "fedala" or "ala" in spec.split("+")


def ala_stream(spec: str, stream: str) -> dict:
    """Keyword arguments of ``tiny_sim`` setting ALA's evaluation stream (``fedala`` takes ALA's options)."""
    if not uses_ala(spec):
        return {}
    return {"options": {"eval_stream": stream}} if spec == "fedala" else {"transforms": {"ala": {"eval_stream": stream}}}


def spec_options(spec: str) -> dict:
    """Keyword arguments of ``tiny_sim`` for the ``[options]`` a spec runs the suite with instead of its defaults
    (``tests.test_shared_suite.SUITE_OPTIONS``: fedamp+ala's, added after the other goldens; none for the others)."""
    from tests.test_shared_suite import SUITE_OPTIONS

    return {"options": SUITE_OPTIONS[spec]} if spec in SUITE_OPTIONS else {}


def history(fed, key: str, stream: str = "eval", **train) -> list[dict]:
    """The history of golden case ``key`` (``"<spec>/<case>"``) without wall-clock fields, as JSON would store it;
    ``train`` overrides training settings of the case (tests of the comparison's tolerance)."""
    from fedblend.common.histories import without_per_client
    from tests.helpers import tiny_sim, without_timings

    spec, case = key.split("/")
    sim = tiny_sim(fed, spec, **{**CASES[case], **train}, **ala_stream(spec, stream), **spec_options(spec))
    sim.run()
    return json.loads(json.dumps(without_per_client(without_timings(sim.history))))


def keys() -> list[str]:
    """Every golden case the suite requires: each spec of the shared suite, in each case."""
    from tests.test_shared_suite import SPECS

    return [f"{spec}/{case}" for spec in SPECS for case in CASES]


def golden_federation():
    """The suite's ``tiny_fed`` federation, at one thread."""
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.synthetic import make_synthetic

    torch.set_num_threads(1)
    return build_federated(make_synthetic(), PartitionSpec(kind="dirichlet", alpha=1.0, num_clients=4, min_samples=5,
                                                           split="merge"), seed=0)


def check(path: str) -> int:
    """Every history in ``path`` reproduced bit for bit by this checkout (same machine); prints each difference
    and the count; 1 if any differs or a spec of this checkout has no history in ``path``."""
    from fedblend.common.histories import diff_histories

    want = json.loads(Path(path).read_text())
    fed = golden_federation()
    missing = sorted(set(keys()) - set(want))
    bad = 0
    for key in sorted(want):
        diffs = diff_histories(want[key], history(fed, key), exact=True)
        bad += bool(diffs)
        print(("ok  " if not diffs else "DIFF") + f" {key}" + "".join(f"\n     {d}" for d in diffs[:10]), flush=True)
    print(f"{len(want) - bad} of {len(want)} bit for bit, {bad} different; registered specs without a history "
          f"there: {missing or 'none'}")
    return 1 if bad or missing else 0


def main(out: str, everything: bool = False) -> None:
    fed = golden_federation()
    path = Path(out)
    result = {} if everything or not path.exists() else json.loads(path.read_text())
    todo = [k for k in keys() if k not in result]
    for key in todo:
        result[key] = history(fed, key)
        print(f"recorded {key}", flush=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(result)} histories to {out} ({len(todo)} new)")


if __name__ == "__main__":
    if "--check" in sys.argv[2:]:
        sys.exit(check(sys.argv[1]))
    main(sys.argv[1], everything="--all" in sys.argv[2:])
