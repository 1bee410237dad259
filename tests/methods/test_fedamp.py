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


# ------------------------------------------------------------------------ fedamp+ala (FedALA Table 4)
CONVEX = {"alpha_k": 0.5, "sigma": 50.0}  # xi_ii > 0: u_i a convex mix of the stored models, close to w_i
ALA_ON = {"ala": {"eta": 2.0}}


def test_fedamp_ala_builds_and_its_evaluation_message_carries_u_i(tiny_fed):
    """FedAMP declares that its clients train from the received u_i, so the registry admits +ala; the evaluation
    message then carries u_i (ALA evaluates its blend from it), where plain FedAMP sends nothing."""
    from fedblend.algorithms import build_method
    from tests.helpers import eval_message

    method = build_method("fedamp+ala")
    assert method.traits.trains_from_received and not method.traits.global_model
    assert build_method("fedamp").traits.evaluates_own_model and not method.traits.evaluates_own_model
    sim = tiny_sim(tiny_fed, "fedamp+ala", CONVEX, ALA_ON, rounds=3, seed=0)
    sim.run_round()
    assert same_state(eval_message(sim, 1).params(), train_message(sim, 1).params())
    assert "personalized model the server would send" in sim.method.traits.eval_model


def test_fedamp_ala_first_round_start_equals_fedamp(tiny_fed):
    """Round 1: nobody has uploaded, so u_i is the initial model, which is also every client's own model: ALA
    has nothing to blend (FedALA: "deactivated in the first iteration"), and each client starts where FedAMP's
    does and trains the same."""
    from tests.methods.common import specs_of

    plain = tiny_sim(tiny_fed, "fedamp", CONVEX, rounds=3, seed=0)
    ala = tiny_sim(tiny_fed, "fedamp+ala", CONVEX, ALA_ON, rounds=3, seed=0)
    for cid in range(tiny_fed.num_clients):
        ((want, _),) = specs_of(plain, cid, train_message(plain, cid))[0]
        ((got, _),) = specs_of(ala, cid, train_message(ala, cid))[0]
        assert same_state(got.params, want.params)
    plain.run_round()
    m = ala.run_round()
    assert m["ala_skipped"] == 1.0
    assert same_state(client_params(ala), client_params(plain))


def test_fedamp_ala_later_rounds_start_from_eq4_blend_with_the_learned_weights(tiny_fed):
    """Round 2 on: client i starts from theta_hat = w_i + (u_i - w_i) * W on the top layer (FedALA Eq. 4, W just
    learned, kept in the state), u_i below; that is neither u_i (FedAMP start = "cloud") nor w_i (start =
    "local")."""
    from fedblend.algorithms.ala.learning import ala_names, blend
    from tests.methods.common import specs_of

    sim = tiny_sim(tiny_fed, "fedamp+ala", CONVEX, ALA_ON, rounds=3, seed=0)
    sim.run_round()
    cid = 2
    msg, before = train_message(sim, cid), sim.store.get(cid)
    u_i, w_i = msg.params(), before["params"]
    ((spec, _),), _, after = specs_of(sim, cid, msg, before)
    weights = after["ala"]["weights"]
    assert set(weights) == set(ala_names(sim.client_ctx(cid, 1).model, 1))
    assert any(not torch.equal(w, torch.ones_like(w)) for w in weights.values())  # W was learned
    assert same_state(spec.params, blend(w_i, u_i, weights))
    assert not same_state(spec.params, u_i) and not same_state(spec.params, w_i)
    top = set(weights)
    assert all(torch.equal(spec.params[n], u_i[n]) for n in u_i if n not in top)  # lower layers: u_i


def test_fedamp_ala_proximal_centre_stays_u_i(tiny_fed):
    """FedAMP Eq. 8's term lambda / (2 alphaK) ||w - u_i||^2 keeps u_i as its centre while training starts from
    ALA's theta_hat (FedALA Alg. 1 changes only the initialisation)."""
    from tests.methods.common import specs_of

    sim = tiny_sim(tiny_fed, "fedamp+ala", {**CONVEX, "lam": 2.0}, ALA_ON, rounds=3, seed=0)
    sim.run_round()
    msg = train_message(sim, 0)
    ((spec, _),), _, _ = specs_of(sim, 0, msg, sim.store.get(0))
    (term,) = spec.loss_terms
    assert term.args["mu"] == 2.0 / CONVEX["alpha_k"]
    assert same_state(term.args["anchor"], msg.params())
    assert not same_state(term.args["anchor"], spec.params)


def test_fedamp_ala_evaluates_the_start_of_the_next_round(tiny_fed):
    """eval = "ala" (training stream): the evaluated model is exactly the theta_hat the client trains from when it
    joins the next round, built from the u_i the evaluation message carries."""
    from tests.helpers import eval_message
    from tests.methods.common import specs_of

    sim = tiny_sim(tiny_fed, "fedamp+ala", CONVEX, ALA_ON, rounds=3, seed=0)
    sim.run_round()
    sim.run_round()
    cid, state = 3, sim.store.get(3)
    ctx = sim.client_ctx(cid, sim.next_round - 1, "evaluate")
    evaluated = sim.method.eval_params(eval_message(sim, cid), state, ctx)
    ((spec, _),), _, _ = specs_of(sim, cid, train_message(sim, cid), state)
    assert same_state(evaluated, spec.params)
    assert not same_state(evaluated, state["params"])  # not FedAMP's own evaluated model


def test_methods_without_a_received_model_refuse_ala_with_the_reason():
    """ALA needs a model the server sends the client to blend with its own (FedALA Eq. 4's theta): Local sends
    nothing; FedFomo's clients start from their own mix of several downloaded models (FedALA leaves it out of
    Table 4 for that); FedAPA is not in FedALA's Table 4 (no reference applies ALA to it)."""
    from fedblend.algorithms import build_method

    for name in ("local", "fedfomo", "fedapa"):
        with pytest.raises(ValueError, match=f"{name} has no global model and declares no personalized model its "
                                             "clients train from"):
            build_method(f"{name}+ala")
