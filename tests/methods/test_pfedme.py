"""pFedMe: the Moreau-envelope inner solve, the local step and the server mix on toy cases."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.pfedme import inner_solve, local_step, server_mix
from fedblend.common.params import weighted_average
from fedblend.core.message import Message
from tests.helpers import same_state, tiny_sim

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pfedme_inner_solver_reaches_the_moreau_argmin_of_a_quadratic():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    w = {"x": torch.randn(3, generator=g, dtype=torch.float64)}
    lam = 2.0

    def f(p):
        return 0.5 * ((a @ p["x"] - b) ** 2).sum()

    closed = torch.linalg.solve(a.T @ a + lam * torch.eye(3, dtype=torch.float64), a.T @ b + lam * w["x"])
    theta = inner_solve(f, {"x": torch.zeros(3, dtype=torch.float64)}, w, lam, lr=0.05, steps=2000)
    assert torch.allclose(theta["x"], closed, atol=1e-8)
    one = inner_solve(f, {"x": torch.zeros(3, dtype=torch.float64)}, w, lam, lr=0.05, steps=1)
    hand = -0.05 * (a.T @ (a @ torch.zeros(3, dtype=torch.float64) - b) - lam * w["x"])
    assert torch.allclose(one["x"], hand)


def test_pfedme_local_and_server_updates():
    w, theta = {"a": torch.tensor([1.0, 2.0])}, {"a": torch.tensor([0.0, 4.0])}
    assert torch.allclose(local_step(w, theta, lamda=15.0, eta=0.01)["a"], torch.tensor([1 - 0.15, 2 + 0.3]))
    old, avg = {"a": torch.tensor([0.0, 2.0])}, {"a": torch.tensor([2.0, 4.0])}
    assert torch.equal(server_mix(old, avg, 1.0)["a"], avg["a"])
    assert torch.allclose(server_mix(old, avg, 0.5)["a"], torch.tensor([1.0, 3.0]))
    assert torch.allclose(server_mix(old, avg, 2.0)["a"], torch.tensor([4.0, 6.0]))


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_pfedme_server_is_fedavg_mixed_by_beta(tiny_fed, beta):
    sim = tiny_sim(tiny_fed, "pfedme", {"beta": beta}, rounds=1)
    g = torch.Generator().manual_seed(3)
    ups = {c: Message({"params": {k: torch.randn(v.shape, generator=g) for k, v in sim.server["global"].items()}},
                      {"num_samples": c + 1}) for c in range(3)}
    out = sim.method.aggregate("train", sim.server, ups, sim.sctx(0))["global"]
    avg = weighted_average([ups[c].params() for c in range(3)], [1, 2, 3])
    for k, v in sim.server["global"].items():
        assert torch.allclose(out[k], (1 - beta) * v + beta * avg[k], atol=1e-6)


def test_pfedme_evaluates_theta_not_w(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedme", rounds=1, seed=0)
    sim.run()
    st = sim.store.get(sim.history[0]["selected"][0])
    assert any(not torch.equal(st["theta"][k], st["params"][k]) for k in st["params"])
    assert same_state(sim.method.personalized_params(Message(), st, None), st["theta"])
