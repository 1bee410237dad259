"""The suite every registered method must pass: two rounds on tiny data, state round-trips through a
checkpoint, training loss decreases, determinism."""

import pytest
import torch

from fedblend.algorithms import METHODS, TRANSFORMS
from tests.helpers import tiny_sim, without_timings

# every transform on every method that has a global model to blend from (FedALA is already FedAvg + ALA)
HOSTS = [m for m in sorted(METHODS) if METHODS[m].has_global and m != "fedala"]
SPECS = sorted(METHODS) + [f"{m}+{t}" for t in sorted(TRANSFORMS) for m in HOSTS]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("spec", SPECS)
def test_method_contract(spec, tiny_fed, tmp_path):
    sim = tiny_sim(tiny_fed, spec, rounds=4, seed=1)
    sim.run_round(), sim.run_round()
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, spec, rounds=4, seed=1)
    twin.restore(tmp_path / "ck.pt")
    assert _same(twin.server, sim.server) and _same(twin.store.states, sim.store.states)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)  # resume from checkpoint == uninterrupted
    losses = [m["train_loss"] for m in sim.history]
    assert losses[-1] < losses[0], losses
