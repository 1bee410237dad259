"""Refactors do not move results: the synthetic runs of every method and method+transform, recorded before the
message-based interface (``tests/golden/record_synthetic.py``), are reproduced exactly, every round and field
except wall-clock times. The real-data benchmark goldens (``tests/golden/benchmarks``) are checked by
``scripts/golden.py check`` (too slow for the default suite)."""

import json
from pathlib import Path

import pytest

from tests.golden.record_synthetic import CASES
from tests.helpers import tiny_sim, without_timings

GOLDEN = json.loads((Path(__file__).parent / "golden" / "synthetic.json").read_text())


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_history(key, tiny_fed):
    spec, case = key.split("/")
    sim = tiny_sim(tiny_fed, spec, **CASES[case])
    sim.run()
    assert json.loads(json.dumps(without_timings(sim.history))) == GOLDEN[key]


def test_every_benchmark_config_has_a_golden():
    repo = Path(__file__).resolve().parents[1]
    stems = {p.stem for p in (repo / "configs" / "benchmarks").glob("*.toml")}
    golden = {p.stem for p in (repo / "tests" / "golden" / "benchmarks").glob("*.jsonl")}
    assert stems <= golden, f"benchmark configs without a golden: {sorted(stems - golden)}"
