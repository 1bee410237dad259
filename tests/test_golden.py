"""Refactors do not move results: the synthetic runs of every method and method+transform (the first eleven
recorded before the message-based interface, the others before issue 22's refactor, all by
``tests/golden/record_synthetic.py``) are reproduced, every round and field except wall-clock times. The
real-data benchmark goldens (``tests/golden/benchmarks``) are checked by ``bookkeeping/golden.py check`` (too slow
for the default suite).

The goldens were recorded on one CPU and are checked on whatever CPU runs the suite, so floats are compared with
the cross-machine tolerance of ``fedblend.common.histories`` and everything discrete exactly (bit-equality holds
only between two runs on the same machine: see the backend and resume tests, and ``bookkeeping/golden.py --exact``).
The per-client fields (``per_client``, ``global_per_client``: each client's correct count and sample count) were
added after the goldens were recorded; they are left out of the comparison (``without_per_client``) rather than
re-recorded, so every field the goldens hold must still match, and
``test_per_client_counts_add_up_to_the_pooled_fields`` ties the new fields to the compared ones.
The tolerance tests show that tolerance is right: it absorbs a last-bit perturbation of every input (what another
CPU's kernels do) and still catches a one-percent change of the learning rate."""

import json
from pathlib import Path

import pytest
import torch

from fedblend.common.histories import diff_histories
from tests.golden.record_synthetic import CASES, ala_stream, history, keys, uses_ala
from tests.helpers import tiny_sim

GOLDEN = json.loads((Path(__file__).parent / "golden" / "synthetic.json").read_text())


pytestmark = pytest.mark.usefixtures("one_thread")


#: fields of the personalized evaluation: the only ones ALA's ``eval_stream = "train"`` (the default since the
#: goldens were recorded) may change; the goldens were evaluated with ``eval_stream = "eval"``
PERSONAL_EVAL = {"acc", "loss", "acc_client_mean", "acc_client_std"}


def _last_bit_up(fed):
    """The same federation with every float input moved up by one ulp: the size of difference another CPU's
    kernels make in a first operation."""
    from fedblend.data.federated import ClientData, FederatedData

    def up(v):
        return torch.nextafter(v, torch.full_like(v, float("inf"))) if v.is_floating_point() else v

    return FederatedData([ClientData(**{k: up(v) for k, v in vars(c).items()}) for c in fed.clients],
                         fed.info, fed.indices, fed.spec, fed.counts)


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_history(key, tiny_fed):
    assert diff_histories(GOLDEN[key], history(tiny_fed, key, "eval")) == []


@pytest.mark.parametrize("key", sorted(k for k in GOLDEN if uses_ala(k.split("/")[0])))
def test_ala_train_stream_changes_only_the_personalized_evaluation(key, tiny_fed):
    """ALA evaluated from the next round's training stream: training (and the global model) exactly as recorded."""
    got = history(tiny_fed, key, "train")
    keep = [{k: v for k, v in w.items() if k not in PERSONAL_EVAL} for w in GOLDEN[key]]
    assert diff_histories(keep, [{k: v for k, v in g.items() if k not in PERSONAL_EVAL} for g in got]) == []


@pytest.mark.parametrize("key", ["fedavg/full", "fedala/partial-keep", "fedapa/full", "fedalp/full"])
def test_golden_tolerance_absorbs_last_bit_drift(key, tiny_fed):
    """Every float input one ulp up changes many numbers in their last bits (so the check is not vacuous) and
    none beyond the tolerance the goldens are checked with."""
    base = history(tiny_fed, key, "eval")
    drift = history(_last_bit_up(tiny_fed), key, "eval")
    assert diff_histories(base, drift, exact=True) != []
    assert diff_histories(base, drift) == []


#: torch's portable kernels, whatever the CPU: no vectorized ATen kernels, oneDNN at its oldest x86 level
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
PORTABLE_CASES = ["fedavg/full", "fedala/partial-keep", "fedapa/full", "fedalp/full", "pfedrlla/partial-keep"]


def test_golden_tolerance_absorbs_another_cpus_kernels(tiny_fed):
    """The same golden cases computed with torch's portable kernels (in a subprocess: the kernels are chosen at
    import) differ from this CPU's vectorized ones in their last bits, and nowhere beyond the tolerance: the real
    difference between two CPUs, where the test above simulates it."""
    import os
    import subprocess
    import sys

    code = ("import json, sys, torch; sys.path.insert(0, '.'); "
            "from tests.golden.record_synthetic import golden_federation, history; fed = golden_federation(); "
            f"print(json.dumps([torch.backends.cpu.get_cpu_capability(), {{k: history(fed, k) for k in {PORTABLE_CASES!r}}}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], check=True,
                         env={**os.environ, **PORTABLE_KERNELS}, capture_output=True, text=True, timeout=600)
    capability, portable = json.loads(out.stdout.splitlines()[-1])
    assert capability == "DEFAULT"
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU already runs torch's portable kernels")
    here = {k: history(tiny_fed, k, "eval") for k in PORTABLE_CASES}
    if all(diff_histories(here[k], portable[k], exact=True) == [] for k in PORTABLE_CASES):
        pytest.skip("the portable kernels give this CPU's results bit for bit: no difference to test the tolerance on")
    assert {k: diff_histories(here[k], portable[k]) for k in PORTABLE_CASES} == {k: [] for k in PORTABLE_CASES}


@pytest.mark.parametrize("key", ["fedavg/full", "fedala/partial-keep", "fedapa/full", "fedalp/full"])
def test_golden_tolerance_catches_a_one_percent_change(key, tiny_fed):
    lr = 0.05  # tiny_sim's learning rate
    assert diff_histories(history(tiny_fed, key, "eval"), history(tiny_fed, key, "eval", lr=lr * 1.01)) != []


def test_every_registered_method_and_transform_host_has_a_golden():
    """A new method (or a method a transform can now host) fails here until its golden is recorded with
    ``python bookkeeping/regenerate.py`` (``tests/golden/record_synthetic.py``: the missing ones only)."""
    missing = sorted(k for k in keys() if k not in GOLDEN)
    assert not missing, f"registered specs without a synthetic golden: {missing}; run python bookkeeping/regenerate.py"


def test_every_benchmark_config_has_a_golden():
    repo = Path(__file__).resolve().parents[1]
    stems = {p.stem for p in (repo / "configs" / "benchmarks").glob("*.toml")}
    golden = {p.stem for p in (repo / "tests" / "golden" / "benchmarks").glob("*.jsonl")}
    assert stems <= golden, f"benchmark configs without a golden: {sorted(stems - golden)}"


@pytest.mark.parametrize("key", ["fedavg/full", "fedala/partial-keep", "fedapa/full"])
def test_per_client_counts_add_up_to_the_pooled_fields(key, tiny_fed):
    """The per-client fields left out of the golden comparison are the counts the compared fields come from:
    pooled accuracy = sum correct / sum n, and mean / std of the per-client accuracies, exactly."""
    import numpy as np

    spec, case = key.split("/")
    sim = tiny_sim(tiny_fed, spec, **CASES[case], **ala_stream(spec, "eval"))
    sim.run()
    for row in sim.history:
        for prefix in ("", "global_"):
            pc = row.get(f"{prefix}per_client")
            if pc is None:
                assert prefix == "global_" and f"{prefix}acc" not in row
                continue
            assert pc["clients"] == list(range(tiny_fed.num_clients))
            assert row[f"{prefix}acc"] == sum(pc["correct"]) / sum(pc["n"])
            accs = np.array([c / n for c, n in zip(pc["correct"], pc["n"])])
            assert row[f"{prefix}acc_client_mean"] == float(accs.mean())
            assert row[f"{prefix}acc_client_std"] == float(accs.std())
