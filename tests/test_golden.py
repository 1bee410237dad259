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


#: fields of the personalized evaluation: the only ones ALA's ``eval_stream = "train"`` (the default since the
#: goldens were recorded) may change; the goldens were evaluated with ``eval_stream = "eval"``
PERSONAL_EVAL = {"acc", "loss", "acc_client_mean", "acc_client_std"}


def uses_ala(spec: str) -> bool:
    return spec == "fedala" or "ala" in spec.split("+")


def ala_stream(spec: str, stream: str) -> dict:
    """Keyword arguments of ``tiny_sim`` setting ALA's evaluation stream (``fedala`` takes ALA's options)."""
    if not uses_ala(spec):
        return {}
    return {"options": {"eval_stream": stream}} if spec == "fedala" else {"transforms": {"ala": {"eval_stream": stream}}}


def _history(tiny_fed, key, stream):
    spec, case = key.split("/")
    sim = tiny_sim(tiny_fed, spec, **CASES[case], **ala_stream(spec, stream))
    sim.run()
    return json.loads(json.dumps(without_timings(sim.history)))


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_history(key, tiny_fed):
    assert _history(tiny_fed, key, "eval") == GOLDEN[key]


@pytest.mark.parametrize("key", sorted(k for k in GOLDEN if uses_ala(k.split("/")[0])))
def test_ala_train_stream_changes_only_the_personalized_evaluation(key, tiny_fed):
    """ALA evaluated from the next round's training stream: training (and the global model) exactly as recorded."""
    got = _history(tiny_fed, key, "train")
    for g, w in zip(got, GOLDEN[key], strict=True):
        assert {k: v for k, v in g.items() if k not in PERSONAL_EVAL} == {k: v for k, v in w.items() if k not in PERSONAL_EVAL}


def test_every_benchmark_config_has_a_golden():
    repo = Path(__file__).resolve().parents[1]
    stems = {p.stem for p in (repo / "configs" / "benchmarks").glob("*.toml")}
    golden = {p.stem for p in (repo / "tests" / "golden" / "benchmarks").glob("*.jsonl")}
    assert stems <= golden, f"benchmark configs without a golden: {sorted(stems - golden)}"
