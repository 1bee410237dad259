"""Per-FedAvg: the meta-step on a closed-form toy case, and its reduction."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.parts.ownloop import batch_loss, grad
from fedblend.algorithms.perfedavg import meta_step
from tests.helpers import tiny_sim
from tests.methods.common import toy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_perfedavg_hf_step_is_the_maml_gradient_of_the_two_step_loss():
    model, w, data = toy()
    f = batch_loss(model, *data[0])
    alpha, beta = 0.3, 0.1
    # autograd of F(w) = f(w - alpha grad f(w)) (Eq. 3), all on the same batch
    leaf = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    g0 = torch.autograd.grad(f(leaf), list(leaf.values()), create_graph=True)
    meta = torch.autograd.grad(f({k: leaf[k] - alpha * gk for k, gk in zip(leaf, g0)}), list(leaf.values()))
    new, _ = meta_step(w, (f, f, f), alpha, beta, "hf", delta=1e-5)
    for (k, v), m in zip(w.items(), meta):
        assert torch.allclose((v - new[k]) / beta, m, atol=1e-7), k
    # FO drops the Hessian term: the step is beta * grad f(w_tilde), which differs from the meta-gradient here
    fo, _ = meta_step(w, (f, f, None), alpha, beta, "fo")
    g = grad(f, {k: w[k] - alpha * v for k, v in grad(f, w).items()})
    assert all(torch.allclose((w[k] - fo[k]) / beta, g[k], atol=1e-12) for k in w)
    assert any(not torch.allclose(g[k], m, atol=1e-4) for k, m in zip(w, meta))


def test_perfedavg_alpha_zero_is_an_sgd_step_on_the_second_batch():
    model, w, data = toy()
    fs = tuple(batch_loss(model, *d) for d in data)
    g = grad(fs[1], w)
    for variant in ("fo", "hf"):
        new, loss = meta_step(w, fs, 0.0, 0.05, variant)
        assert all(torch.allclose(new[k], w[k] - 0.05 * g[k], atol=1e-12) for k in w), variant
        assert loss == pytest.approx(float(fs[1](w)))


def test_perfedavg_evaluates_the_one_step_adapted_global_model(tiny_fed):
    sim = tiny_sim(tiny_fed, "perfedavg", {"alpha": 0.0}, rounds=2, seed=0)
    sim.run()
    ev = sim.evaluate(2)
    assert ev["acc"] == pytest.approx(ev["global_acc"])  # alpha = 0: the adaptation does not move the model
    sim2 = tiny_sim(tiny_fed, "perfedavg", {"alpha": 0.5}, rounds=2, seed=0)
    sim2.run()
    ev2 = sim2.evaluate(2)
    assert ev2["global_acc"] != pytest.approx(ev2["acc"])  # alpha > 0: the personalized model differs
