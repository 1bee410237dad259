"""Ditto: the personalized update's proximal step by hand, lam = 0 reduces to Local bit for bit, what travels."""

from __future__ import annotations

import pytest
import torch

from fedblend.core.message import Message
from tests.helpers import eval_message, same_state, tiny_sim, train_message
from tests.methods.common import FULL_BATCH, ce_grad, perturbed, specs_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ditto_personal_step_is_the_proximal_gradient_step(tiny_fed):
    lam, lr = 0.7, 0.05
    sim = tiny_sim(tiny_fed, "ditto", {"lam": lam}, rounds=1, batch_size=FULL_BATCH, lr=lr)
    msg = train_message(sim, 0)
    w_t = perturbed(msg.params(), seed=1)  # a global model that differs from v_k (= w^0)
    msg = Message({"params": w_t})
    log, reply, state = specs_of(sim, 0, msg)
    assert len(log) == 2 and log[0][0].stream == "global" and log[1][0].stream == "batches"
    v0 = sim.run_info.init_params
    d = tiny_fed.clients[0]
    g = ce_grad(sim.run_info.model, v0, d.train_x, d.train_y)
    want = {k: v0[k] - lr * (g[k] + lam * (v0[k] - w_t[k])) for k in v0}  # v - eta (grad F + lam (v - w^t))
    assert all(torch.allclose(state["personal"][k], want[k], atol=1e-6) for k in want)
    without = {k: v0[k] - lr * g[k] for k in v0}
    assert not all(torch.allclose(state["personal"][k], without[k], atol=1e-6) for k in want)  # the pull acted
    # the global update is FedAvg's step on w^t, and that is what is sent
    gw = ce_grad(sim.run_info.model, w_t, d.train_x, d.train_y)
    assert all(torch.allclose(reply.params()[k], w_t[k] - lr * gw[k], atol=1e-6) for k in w_t)


def test_ditto_lam_zero_is_local_bit_for_bit(tiny_fed):
    kw = dict(rounds=3, seed=7, join_ratio=0.5, momentum=0.5, optimizer_state="keep")
    ditto = tiny_sim(tiny_fed, "ditto", {"lam": 0.0}, **kw)
    local = tiny_sim(tiny_fed, "local", **kw)
    ditto.run(), local.run()
    assert [m["acc"] for m in ditto.history] == [m["acc"] for m in local.history]
    assert set(ditto.store.states) == set(local.store.states)
    for cid, st in local.store.states.items():
        assert same_state(ditto.store.states[cid]["personal"], st["params"])
        assert same_state(ditto.store.states[cid]["personal_momentum"], st["momentum"])
    lam = tiny_sim(tiny_fed, "ditto", {"lam": 1.0}, **kw)
    lam.run()
    assert not any(same_state(lam.store.states[c]["personal"], st["params"]) for c, st in local.store.states.items())


def test_ditto_evaluates_the_personalized_model(tiny_fed):
    sim = tiny_sim(tiny_fed, "ditto+ala", rounds=2, seed=3)
    sim.run()
    msg = eval_message(sim, 1)
    ctx = sim.client_ctx(1, sim.next_round)
    st = sim.store.get(1)
    assert same_state(sim.method.eval_params(msg, st, ctx), st["personal"])
    assert "params" in st and not same_state(st["params"], st["personal"])  # ALA's copy of the global update
