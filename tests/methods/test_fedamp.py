"""FedAMP: the attention weights (Eq. 7) by hand, the cloud models, lam = 0 reductions, what travels."""

from __future__ import annotations

import math

import pytest
import torch

from fedblend.algorithms.fedamp import attention_weights
from tests.helpers import same_state, tiny_sim, train_message
from tests.methods.common import client_params

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedamp_attention_weights_by_hand():
    """Eq. 7: xi_ij = alphaK exp(-||w_i - w_j||^2 / sigma) / sigma, xi_ii = 1 - sum_{j != i} xi_ij."""
    flat = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # squared distances from 0: 1 and 4
    xi = attention_weights(flat, 0, torch.ones(3), alpha_k=0.5, sigma=2.0)
    e1, e2 = 0.5 * math.exp(-0.5) / 2.0, 0.5 * math.exp(-2.0) / 2.0
    assert torch.allclose(xi, torch.tensor([1 - e1 - e2, e1, e2], dtype=torch.float64))
    # a client that never uploaded is left out; the self weight absorbs the rest
    xi = attention_weights(flat, 0, torch.tensor([1.0, 1.0, 0.0]), alpha_k=0.5, sigma=2.0)
    assert torch.allclose(xi, torch.tensor([1 - e1, e1, 0.0], dtype=torch.float64))
    # u_i = sum_j xi_ij w_j (the server's cloud model) with these weights
    assert torch.allclose(xi @ flat.double(), torch.tensor([e1, 0.0], dtype=torch.float64))


def test_fedamp_cloud_model_in_the_message(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedamp", {"alpha_k": 0.5, "sigma": 50.0}, rounds=3, seed=0)
    sim.run_round()
    models, seen = sim.server["models"], sim.server["seen"]
    assert seen.tolist() == [1.0] * 4
    flat = torch.cat([t.reshape(4, -1) for t in models.values()], 1)
    xi = attention_weights(flat, 2, seen, 0.5, 50.0)
    assert 0 < float(xi[0]) < 1 and float(xi[2]) > 0
    sent = train_message(sim, 2).params()
    for n, t in models.items():
        want = (xi.view(-1, *([1] * (t.dim() - 1))) * t.double()).sum(0).float()
        assert torch.allclose(sent[n], want, atol=1e-6), n


def test_fedamp_lambda_zero_is_local(tiny_fed):
    a = tiny_sim(tiny_fed, "fedamp", {"lam": 0.0}, rounds=3, seed=7, join_ratio=0.75)
    b = tiny_sim(tiny_fed, "local", rounds=3, seed=7, join_ratio=0.75)
    a.run(), b.run()
    assert same_state(client_params(a), client_params(b))
    assert [m["acc"] for m in a.history] == [m["acc"] for m in b.history]
    c = tiny_sim(tiny_fed, "fedamp", {"lam": 1.0, "alpha_k": 1.0}, rounds=3, seed=7, join_ratio=0.75)
    c.run()
    assert not same_state(client_params(c), client_params(b))  # the pull does act


def test_fedamp_proximal_pull_is_fedprox_term(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedamp", {"lam": 2.0, "alpha_k": 4.0}, rounds=2, seed=0)
    msg = train_message(sim, 1)
    state = sim.method.init_client(sim.client_ctx(1, 0))
    (term,) = sim.method.loss_terms(msg, state["params"], state, sim.client_ctx(1, 0))
    assert term.args["mu"] == 0.5  # lambda / alphaK, so the term is lambda / (2 alphaK) ||w - u_i||^2
    assert same_state(term.args["anchor"], msg.params())


def test_fedamp_warns_when_the_self_weight_is_negative(tiny_fed):
    """With alpha_k above sigma / (M - 1) the self weight of close models goes negative (u_i extrapolates): the
    server warns; at or below the bound it cannot, and it does not."""
    import warnings

    flat = torch.zeros(4, 3)  # identical models: every A'(0) = 1 / sigma
    assert float(attention_weights(flat, 0, torch.ones(4), alpha_k=0.1 / 3, sigma=0.1)[0]) == pytest.approx(0.0)
    assert float(attention_weights(flat, 0, torch.ones(4), alpha_k=1000.0, sigma=0.1)[0]) < -1e4
    loud = tiny_sim(tiny_fed, "fedamp", {"alpha_k": 1000.0, "sigma": 0.1}, rounds=2, seed=0)
    loud.run_round()
    with pytest.warns(UserWarning, match="self weight xi_ii < 0"):
        train_message(loud, 0)
    quiet = tiny_sim(tiny_fed, "fedamp", {"alpha_k": 0.1 / 3, "sigma": 0.1}, rounds=2, seed=0)
    quiet.run_round()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_message(quiet, 0)
