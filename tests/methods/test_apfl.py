"""APFL: the alpha / v / w step by hand, alpha fixed at 0 reduces to FedAvg bit for bit, the evaluated mixture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.apfl import ALPHA, APFL, LOCAL, mix
from fedblend.core.evaluation import EvalProtocol
from tests.helpers import eval_message, run_client, same_state, tiny_sim, train_message
from tests.methods.common import FULL_BATCH, ce_grad, perturbed, specs_of

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("reg", [0.0, 0.4])
def test_apfl_step_matches_the_papers_updates_plus_the_optional_alpha_term(tiny_fed, reg):
    """Eq. 10 and Alg. 1 by hand; ``alpha_reg = c`` adds ``c * alpha`` to alpha's gradient (the authors' code) and
    changes nothing else."""
    lr = 0.05
    sim = tiny_sim(tiny_fed, "apfl", {"alpha": 0.3, "alpha_reg": reg}, rounds=1, batch_size=FULL_BATCH, lr=lr)
    msg = train_message(sim, 0)
    w = msg.params()
    ctx = sim.client_ctx(0, 0)
    state = sim.method.init_client(ctx)
    v = perturbed(state["apfl"]["v"], scale=0.3, seed=2)  # v_i != w, so alpha has a gradient
    state = {**state, "apfl": {**state["apfl"], "v": v}}
    log, reply, new = specs_of(sim, 0, msg, state)
    assert len(log) == 1
    d, model, alpha = tiny_fed.clients[0], sim.run_info.model, 0.3
    v_bar = mix(v, w, alpha)
    g = ce_grad(model, v_bar, d.train_x, d.train_y)
    # Eq. 10 by hand: grad_alpha f(v_bar) = <v - w, grad f(v_bar)>
    g_alpha = sum(float(((v[k] - w[k]) * g[k]).sum()) for k in w)
    # ... and by autograd through v_bar(alpha)
    a = torch.tensor(alpha, requires_grad=True)
    loss = F.cross_entropy(functional_call(model, mix(v, w, a), (d.train_x,)), d.train_y)
    assert abs(float(torch.autograd.grad(loss, a)[0]) - g_alpha) < 1e-5
    assert abs(float(new["apfl"]["alpha"]) - (alpha - lr * (g_alpha + reg * alpha))) < 1e-6
    assert abs(g_alpha) * lr > 1e-5  # alpha moved by a visible amount
    assert all(torch.allclose(new["apfl"]["v"][k], v[k] - lr * alpha * g[k], atol=1e-6) for k in v)
    gw = ce_grad(model, w, d.train_x, d.train_y)
    assert all(torch.allclose(reply.params()[k], w[k] - lr * gw[k], atol=1e-6) for k in w)
    assert set(reply.params()) == set(w)  # v_i and alpha_i never travel
    assert LOCAL not in new["apfl"]["v"] and ALPHA not in reply.params()


def test_apfl_pflib_variant_steps_v_on_its_own_loss_and_overwrites_it_with_the_mixture(tiny_fed):
    """``local_loss = "own"``: ``v <- v - eta grad f(v)`` (PFLlib), alpha still Eq. 10's step; ``overwrite``: after
    training ``v`` becomes ``alpha v + (1 - alpha) w`` with the trained ``w`` and is what is evaluated."""
    lr, alpha = 0.05, 0.3
    got = {}
    for overwrite in (False, True):
        sim = tiny_sim(tiny_fed, "apfl", {"alpha": alpha, "local_loss": "own", "overwrite": overwrite}, rounds=1,
                       batch_size=FULL_BATCH, lr=lr)
        msg = train_message(sim, 0)
        state = sim.method.init_client(sim.client_ctx(0, 0))
        v = perturbed(state["apfl"]["v"], scale=0.3, seed=2)
        state = {**state, "apfl": {**state["apfl"], "v": v}}
        got[overwrite] = (msg, v, *specs_of(sim, 0, msg, state), sim)
    msg, v, _, reply, new, sim = got[False]
    w = msg.params()
    d, model = tiny_fed.clients[0], sim.run_info.model
    gv = ce_grad(model, v, d.train_x, d.train_y)
    assert all(torch.allclose(new["apfl"]["v"][k], v[k] - lr * gv[k], atol=1e-6) for k in v)
    g = ce_grad(model, mix(v, w, alpha), d.train_x, d.train_y)
    g_alpha = sum(float(((v[k] - w[k]) * g[k]).sum()) for k in w)
    assert abs(float(new["apfl"]["alpha"]) - (alpha - lr * g_alpha)) < 1e-6
    _, _, _, reply2, new2, sim2 = got[True]
    a = new["apfl"]["alpha"]
    assert float(new2["apfl"]["alpha"]) == float(a) and same_state(reply2.params(), reply.params())
    assert same_state(new2["apfl"]["v"], mix(new["apfl"]["v"], reply.params(), a))
    ev = eval_message(sim2, 0)
    assert same_state(sim2.method.eval_params(ev, new2, sim2.client_ctx(0, 1)), new2["apfl"]["v"])


def test_apfl_alpha_clipped_to_unit_interval(tiny_fed):
    """Starting at an end of [0, 1], the step leaves the interval at one end; ``clip`` projects it back."""
    out = []
    for start in (0.0, 1.0):
        got = {}
        for clip in (False, True):
            sim = tiny_sim(tiny_fed, "apfl", {"alpha": start, "clip": clip}, rounds=1, lr=0.5)
            state = sim.method.init_client(sim.client_ctx(0, 0))
            state = {**state, "apfl": {**state["apfl"], "v": perturbed(state["apfl"]["v"], scale=0.5)}}
            got[clip] = float(specs_of(sim, 0, train_message(sim, 0), state)[2]["apfl"]["alpha"])
        assert got[True] == min(1.0, max(0.0, got[False]))
        out.append(not 0.0 <= got[False] <= 1.0)
    assert any(out)


def test_apfl_fixed_alpha_zero_is_fedavg_bit_for_bit(tiny_fed):
    kw = dict(rounds=3, seed=5, join_ratio=0.75, momentum=0.5, optimizer_state="keep")
    apfl = tiny_sim(tiny_fed, "apfl", {"alpha": 0.0, "adaptive": False}, **kw)
    fedavg = tiny_sim(tiny_fed, "fedavg", **kw)
    apfl.run(), fedavg.run()
    keys = ("acc", "global_acc", "train_loss", "selected")
    assert [[m[k] for k in keys] for m in apfl.history] == [[m[k] for k in keys] for m in fedavg.history]
    assert same_state(apfl.server["global"], fedavg.server["global"])
    fixed = tiny_sim(tiny_fed, "apfl", {"alpha": 0.25, "adaptive": False}, **kw)
    adaptive = tiny_sim(tiny_fed, "apfl", {"alpha": 0.25}, **kw)
    fixed.run(), adaptive.run()
    assert all(float(s["apfl"]["alpha"]) == 0.25 for s in fixed.store.states.values())
    assert all(float(s["apfl"]["alpha"]) != 0.25 for s in adaptive.store.states.values())


def test_apfl_evaluates_the_mixture(tiny_fed):
    for spec in ("apfl", "apfl+ala"):
        sim = tiny_sim(tiny_fed, spec, rounds=3, seed=4)
        sim.run()
        ev, st, ctx = eval_message(sim, 0), sim.store.get(0), sim.client_ctx(0, sim.next_round)
        p = sim.method.eval_params(ev, st, ctx)
        a = st["apfl"]["alpha"]
        received = sim.method.client_init(ev, st, ctx)
        w = ev.params() if spec == "apfl" else sim.method.transforms[0].eval_params(sim.method, ev, st, ctx, received)
        assert 0.0 < float(a) < 1.0
        assert all(torch.allclose(p[k], a * st["apfl"]["v"][k] + (1 - a) * w[k]) for k in w)
        assert "mixture" in sim.method.traits.eval_model


def test_apfl_eval_model_trained_mixes_the_clients_own_trained_copy_and_leaves_training_alone(tiny_fed):
    """``[eval] model = "trained"`` (PFLlib's ``model_per``): the evaluated mixture takes the client's own copy of
    ``w`` after its last local training (the copy it uploaded), not the received global model; training, and so
    the global model, is the default's bit for bit; before its first training a client mixes the received model."""
    kw = dict(rounds=3, seed=4, join_ratio=0.5)
    paper = tiny_sim(tiny_fed, "apfl", **kw)
    pflib = tiny_sim(tiny_fed, "apfl", **kw, protocol=EvalProtocol(model="trained"))
    assert pflib.store.get(0) is None  # not contacted yet: the received model is mixed
    ev, ctx = eval_message(pflib, 0), pflib.client_ctx(0, pflib.next_round)
    st = pflib.method.init_client(ctx)
    assert same_state(pflib.method.eval_params(ev, st, ctx), mix(st["apfl"]["v"], ev.params(), st["apfl"]["alpha"]))
    paper.run(), pflib.run()
    assert same_state(paper.server["global"], pflib.server["global"])
    assert [m["train_loss"] for m in paper.history] == [m["train_loss"] for m in pflib.history]
    assert [m["acc"] for m in paper.history] != [m["acc"] for m in pflib.history]
    res = run_client(pflib, 1, train_message(pflib, 1))
    st = res.state["apfl"]
    assert same_state(st["w"], res.reply.params())  # the copy it uploads
    ev, ctx = eval_message(pflib, 1), pflib.client_ctx(1, pflib.next_round)
    p = pflib.method.eval_params(ev, res.state, ctx)
    assert same_state(p, mix(st["v"], st["w"], st["alpha"]))
    assert not same_state(p, mix(st["v"], ev.params(), st["alpha"]))
    assert "own copy after its last local training" in pflib.method.traits.eval_model
    trained = [c for c in range(len(tiny_fed.clients)) if paper.store.get(c) is not None]
    assert trained and all("w" not in paper.store.get(c)["apfl"] for c in trained)  # the default keeps no copy
    assert all("w" in pflib.store.get(c)["apfl"] for c in trained)


def test_apfl_eval_model_trained_passes_the_contract_checks(tiny_fed, tmp_path):
    """The extra per-client copy is state like any other: resume, evaluation without side effects, partial
    participation (fedblend.testing's contract checks, run on the option)."""
    from fedblend.testing import (
        check_evaluation_leaves_states_unchanged,
        check_partial_participation,
        check_rounds_resume_and_loss,
    )

    class APFLTrained(APFL):  # APFL evaluating [eval] model = "trained", as the checks build it from a class
        def __init__(self, options=None, transforms=None):
            super().__init__(options, transforms, eval_choice="trained")

    assert APFLTrained().traits.eval_choice == "trained"
    check_rounds_resume_and_loss(APFLTrained, tiny_fed, tmp_path)
    check_evaluation_leaves_states_unchanged(APFLTrained, tiny_fed)
    check_partial_participation(APFLTrained, tiny_fed)


@pytest.mark.parametrize("spec", ["apfl", "apfl+ala"])
def test_apfl_records_each_clients_alpha_per_round_besides_the_mean(tiny_fed, spec):
    """``client_stats = ("apfl_alpha",)``: every round's ``stats_per_client`` holds each selected client's alpha,
    whose mean is the row's ``apfl_alpha``; after the last round, the alphas the clients keep. With ``+ala`` the
    transform's stats come after APFL's."""
    sim = tiny_sim(tiny_fed, spec, {"alpha": 0.5}, rounds=2, lr=0.1)
    assert sim.method.traits.per_client_stats[0] == "apfl_alpha"
    assert ("ala_epochs" in sim.method.traits.per_client_stats) == (spec == "apfl+ala")
    sim.run()
    for m in sim.history:
        pc = m["stats_per_client"]
        assert pc["clients"] == m["selected"] and len(pc["apfl_alpha"]) == len(pc["clients"])
        assert m["apfl_alpha"] == pytest.approx(sum(pc["apfl_alpha"]) / len(pc["clients"]))
    last = sim.history[-1]["stats_per_client"]
    assert last["apfl_alpha"] == [float(sim.store.get(c)["apfl"]["alpha"]) for c in last["clients"]]
    assert len(set(last["apfl_alpha"])) > 1  # learned per client, not one value


@pytest.mark.parametrize("local_loss", ["mixture", "own"])
def test_apfl_alpha_after_steps_takes_eq10s_gradient_at_the_stepped_models(tiny_fed, local_loss):
    """``alpha_order = "after_steps"`` (PFLlib): ``w`` and ``v_i`` take the spec path's steps bit for bit, then
    ``alpha_i`` takes Eq. 10's gradient (+ ``alpha_reg``) at the *stepped* ``v_i`` and ``w`` on the same batch, not
    at the values before the step (which the default takes)."""
    lr, alpha, reg = 0.05, 0.3, 0.4
    got = {}
    for order in ("simultaneous", "after_steps"):
        sim = tiny_sim(tiny_fed, "apfl", {"alpha": alpha, "alpha_reg": reg, "local_loss": local_loss,
                                          "alpha_order": order}, rounds=1, batch_size=FULL_BATCH, lr=lr)
        msg = train_message(sim, 0)
        state = sim.method.init_client(sim.client_ctx(0, 0))
        v = perturbed(state["apfl"]["v"], scale=0.3, seed=2)
        state = {**state, "apfl": {**state["apfl"], "v": v}}
        got[order] = (*specs_of(sim, 0, msg, state), msg, v, sim)
    log, reply, new, msg, v, sim = got["after_steps"]
    _, reply0, new0, *_ = got["simultaneous"]
    assert log == [] and sim.method.traits.own_loop  # a loop of its own, run one by one by a batching backend
    assert same_state(reply.params(), reply0.params()) and same_state(new["apfl"]["v"], new0["apfl"]["v"])
    d, model = tiny_fed.clients[0], sim.run_info.model
    w1, v1 = reply.params(), new["apfl"]["v"]  # v before the overwrite-free keep: the stepped v_i
    g = ce_grad(model, mix(v1, w1, alpha), d.train_x, d.train_y)
    g_alpha = sum(float(((v1[k] - w1[k]) * g[k]).sum()) for k in w1)
    assert abs(float(new["apfl"]["alpha"]) - (alpha - lr * (g_alpha + reg * alpha))) < 1e-6
    assert abs(float(new["apfl"]["alpha"]) - float(new0["apfl"]["alpha"])) > 1e-6  # not the simultaneous step


def test_apfl_alpha_after_steps_with_alpha_fixed_is_the_spec_path_bit_for_bit(tiny_fed):
    """With ``adaptive = false`` the own loop is the spec path: same batches, same steps, momentum kept."""
    kw = dict(rounds=2, seed=4, momentum=0.5, optimizer_state="keep")
    runs = [tiny_sim(tiny_fed, "apfl", {"alpha": 0.4, "adaptive": False, "local_loss": "own", "alpha_order": o}, **kw)
            for o in ("simultaneous", "after_steps")]
    for sim in runs:
        sim.run()
    keys = ("acc", "global_acc", "train_loss")
    assert [[m[k] for k in keys] for m in runs[0].history] == [[m[k] for k in keys] for m in runs[1].history]
    assert all(same_state(runs[0].store.states[c], runs[1].store.states[c]) for c in runs[0].store.states)
