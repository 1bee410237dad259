"""pFedHN, pFedLA, FedPAC, DBE: each paper's core equation on a hand-computed toy case, reductions, and which
parts of the model travel."""

import pytest
import torch

from fedblend.algorithms.dbe import PRBM, fold_bias, mean_regulariser
from fedblend.algorithms.fedpac import (
    aggregate_centroids,
    alignment_loss,
    combination_weights,
    feature_statistics,
    qp_matrix,
    solve_simplex_qp,
)
from fedblend.algorithms.pfedhn import PFedHNOptions, generate, hypernet_grads, init_hypernet
from fedblend.algorithms.pfedla import PFedLAOptions, groups, layer_weights, layerwise_aggregate
from fedblend.algorithms.pfedla import init_hypernet as la_init
from fedblend.common.params import weighted_average
from fedblend.core.optim import sgd_init, sgd_step
from fedblend.core.training import Batch, TrainConfig, sgd_train
from fedblend.models.zoo import MLP
from tests.helpers import run_client, tiny_sim, train_message, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------- pFedHN
def _targets():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(3, 2, generator=g), "a.bias": torch.randn(3, generator=g)}


def test_pfedhn_update_direction_is_the_vjp_with_the_returned_delta():
    """Alg. 1 lines 8-10: grad = (d theta_i / d phi)^T (theta_i - theta~_i), against autograd of <theta(phi), delta>."""
    targets = _targets()
    shapes = {k: v.shape for k, v in targets.items()}
    net = init_hypernet(targets, 5, PFedHNOptions(hidden=7, n_hidden=2), torch.Generator().manual_seed(1))
    with torch.no_grad():
        gen = generate(net, 2, shapes)
    trained = {k: v + 0.3 * torch.randn_like(v) for k, v in gen.items()}
    got = hypernet_grads(net, 2, shapes, trained)
    leaves = {k: v.clone().requires_grad_(True) for k, v in net.items()}
    out = generate(leaves, 2, shapes)
    inner = sum((out[k] * (gen[k] - trained[k])).sum() for k in out)
    want = dict(zip(leaves, torch.autograd.grad(inner, list(leaves.values()), allow_unused=True)))
    for k in net:
        w = torch.zeros_like(net[k]) if want[k] is None else want[k]
        assert torch.allclose(got[k], w, atol=1e-6), k
    assert got["embed"][0].abs().sum() == 0 and got["embed"][2].abs().sum() > 0  # only v_i of the client moves
    # a small step against it brings the generated model towards the trained one
    step, _ = sgd_step(net, got, sgd_init(net), 1e-3)
    with torch.no_grad():
        after = generate(step, 2, shapes)
    dist = lambda p: sum(float(((p[k] - trained[k]) ** 2).sum()) for k in p)  # noqa: E731
    assert dist(after) < dist(gen)


def test_sgd_step_equals_torch_sgd_with_momentum_and_decay():
    net = {"w": torch.tensor([1.0, -2.0]), "e": torch.tensor([0.5])}
    grads = [{"w": torch.tensor([0.3, 0.1]), "e": torch.tensor([1.0])},
             {"w": torch.tensor([-0.2, 0.4]), "e": torch.tensor([2.0])}]
    ours, opt = dict(net), sgd_init(net)
    for g in grads:
        ours, opt = sgd_step(ours, g, opt, 0.1, 0.9, 0.01, lrs={"e": 0.5}, decay={"e": False})
    w, e = torch.nn.Parameter(net["w"].clone()), torch.nn.Parameter(net["e"].clone())
    ref = torch.optim.SGD([{"params": [w]}, {"params": [e], "lr": 0.5, "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                          weight_decay=0.01)
    for g in grads:
        w.grad, e.grad = g["w"].clone(), g["e"].clone()
        ref.step()
    assert torch.allclose(ours["w"], w.detach()) and torch.allclose(ours["e"], e.detach())


def test_pfedhn_pc_keeps_the_head_on_the_client(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedhn", {"personal_head": True}, rounds=2)
    sim.run()
    head = set(sim.model.head_names())
    msg = train_message(sim, 0)
    assert not head & set(msg.params()) and set(msg.params()) == set(sim.model.body_names())
    reply = run_client(sim, 0, msg).reply
    assert not head & set(reply.params())
    full = tiny_sim(tiny_fed, "pfedhn", rounds=1)
    assert set(train_message(full, 0).params()) == set(full.run_info.init_params)


# ---------------------------------------------------------------------------------------------------- pFedLA
def test_pfedla_layerwise_aggregation_with_given_alphas():
    """theta-bar^l = sum_j alpha^{l,j} theta_j^l: weight and bias of a layer share the layer's weights."""
    thetas = {"a.weight": torch.tensor([[[1.0, 2.0]], [[3.0, 6.0]]]), "a.bias": torch.tensor([[1.0], [5.0]]),
              "b.weight": torch.tensor([[[2.0]], [[4.0]]])}
    grouping = groups(list(thetas), "layer")
    assert grouping == [["a.weight", "a.bias"], ["b.weight"]]
    alpha = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    out = layerwise_aggregate(alpha, thetas, grouping)
    assert torch.allclose(out["a.weight"], torch.tensor([[2.5, 5.0]]))  # 0.25*[1,2] + 0.75*[3,6]
    assert torch.allclose(out["a.bias"], torch.tensor([4.0]))  # 0.25*1 + 0.75*5
    assert torch.allclose(out["b.weight"], torch.tensor([[2.0]]))
    assert groups(list(thetas), "tensor") == [["a.weight"], ["a.bias"], ["b.weight"]]


def test_pfedla_hypernetwork_gradient_is_the_chain_rule_and_descends():
    from fedblend.algorithms.parts.hypernet import proxy_cotangent, vjp

    g = torch.Generator().manual_seed(3)
    thetas = {"a.weight": torch.randn(3, 2, 2, generator=g), "b.bias": torch.randn(3, 4, generator=g)}
    grouping = groups(list(thetas), "layer")
    net = la_init(len(grouping), 3, PFedLAOptions(embed_dim=4, hidden=5), g)

    def build(n):
        return layerwise_aggregate(layer_weights(n, 1, len(grouping)), thetas, grouping)

    with torch.no_grad():
        bar = build(net)
    alpha = layer_weights(net, 1, len(grouping))
    assert torch.allclose(alpha.sum(1), torch.ones(len(grouping))) and bool((alpha >= 0).all())
    trained = {k: v + 0.5 for k, v in bar.items()}
    grads = vjp(net, build, proxy_cotangent(bar, trained, "descent"))
    leaves = {k: v.clone().requires_grad_(True) for k, v in net.items()}
    out = build(leaves)
    loss = 0.5 * sum(((out[k] - trained[k]) ** 2).sum() for k in out)
    want = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    for (k, v), w in zip(net.items(), want):
        assert torch.allclose(grads[k], torch.zeros_like(v) if w is None else w, atol=1e-5), k
    literal = vjp(net, build, proxy_cotangent(bar, trained, "literal"))
    assert all(torch.allclose(literal[k], -grads[k]) for k in grads)


# ---------------------------------------------------------------------------------------------------- FedPAC
def test_fedpac_qp_on_the_simplex_with_a_known_answer():
    """Equal statistics (D = 0): min sum alpha_j^2 V_j on the simplex -> alpha_j proportional to 1 / V_j."""
    v = torch.tensor([1.0, 2.0, 4.0])
    hs = torch.zeros(3, 2, 3)
    a = combination_weights(v, hs)
    assert torch.allclose(a.sum(1), torch.ones(3, dtype=a.dtype)) and bool((a >= 0).all())
    assert torch.allclose(a[0], torch.tensor([4 / 7, 2 / 7, 1 / 7], dtype=a.dtype), atol=1e-5)
    # a client far from the others (large bias term) and no variance anywhere keeps its own head
    hs2 = torch.zeros(3, 1, 2)
    hs2[0, 0] = torch.tensor([5.0, 0.0])
    assert torch.allclose(combination_weights(torch.zeros(3), hs2)[0], torch.tensor([1.0, 0, 0], dtype=a.dtype),
                          atol=1e-5)


def test_fedpac_qp_matrix_is_variance_plus_bias_gram():
    hs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])
    v = torch.tensor([0.5, 0.25, 0.125])
    p = qp_matrix(0, v, hs)
    # rows j: h_0 - h_j = [0,0], [1,-1], [0,-1]
    want = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.25 + 2.0, 1.0], [0.0, 1.0, 0.125 + 1.0]], dtype=torch.float64)
    assert torch.allclose(p, want)
    a = solve_simplex_qp(p)
    brute = min((float(x @ p @ x), x) for x in (torch.tensor([i / 50, j / 50, (50 - i - j) / 50], dtype=torch.float64)
                                               for i in range(51) for j in range(51 - i)))
    assert float(a @ p @ a) <= brute[0] + 1e-9


def test_fedpac_statistics_and_alignment_on_hand_values():
    model = MLP(2, 2, hidden=2)
    with torch.no_grad():
        params = {"fc1.weight": torch.eye(2), "fc1.bias": torch.zeros(2), "fc2.weight": torch.eye(2),
                  "fc2.bias": torch.zeros(2)}
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1, 1])
    s = feature_statistics(model, params, x, y, 3)
    assert torch.allclose(s["mu"], torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
    assert torch.allclose(s["h"], 0.5 * s["mu"])
    # V = [sum_k p_k tr E[ff^T|k] - sum_k p_k^2 ||mu_k||^2] / n = [0.5*5 + 0.5*4 - 0.25*4 - 0.25*4] / 4
    assert torch.allclose(s["V"], torch.tensor([0.625]))
    cent, has = aggregate_centroids([s["mu"], torch.tensor([[4.0, 0.0], [9.0, 9.0], [0.0, 0.0]])],
                                    [s["counts"], torch.tensor([2.0, 0.0, 0.0])], "counts")
    assert torch.allclose(cent[0], torch.tensor([3.0, 0.0])) and has.tolist() == [True, True, False]
    batch = Batch(x, y, None, torch.tensor([[1.0, 1.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0]]))
    got = alignment_loss({}, batch, cent, has, 2.0, False)
    assert torch.isclose(got, torch.tensor(2.0 * (5.0 + 13.0 + 4.0 + 4.0) / 4))  # mean ||f - c_y||^2, * lambda
    per_entry = alignment_loss({}, batch, cent, has, 2.0, True)  # the authors' MSELoss: also / d
    assert torch.isclose(per_entry, got / 2)


def test_fedpac_without_alignment_and_collaboration_is_fedper_like(tiny_fed):
    """lambda = 0 and own head: the body is FedAvg of the uploads, each client gets its own trained head back."""
    sim = tiny_sim(tiny_fed, "fedpac", {"lam": 0.0, "combine": "local"}, rounds=2)
    sim.run_round()
    msgs = {c: train_message(sim, c) for c in range(4)}
    replies = {c: run_client(sim, c, msgs[c]).reply for c in range(4)}
    before = sim.server
    after = sim.method.aggregate("train", before, replies, sim.sctx(1))
    body = sim.model.body_names()
    want = weighted_average([{n: replies[c].params()[n] for n in body} for c in range(4)],
                            [replies[c].metrics["num_samples"] for c in range(4)])
    assert all(torch.equal(after["global"][n], want[n]) for n in body)
    head = sim.model.head_names()
    assert all(torch.equal(after["heads"][c][n], replies[c].params()[n]) for c in range(4) for n in head)
    qp = tiny_sim(tiny_fed, "fedpac", rounds=2)
    qp.run_round()
    assert "fedpac_self_weight" in qp.history[-1] and 0 < qp.history[-1]["fedpac_self_weight"] <= 1


# ---------------------------------------------------------------------------------------------------- DBE
def test_dbe_mean_regulariser_and_bias_on_hand_values():
    feats = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    batch = Batch(None, None, None, feats)
    # batch mean [2, 4], global [1, 1]: kappa * 1/(2K) * (1 + 9) = 3 * 10 / 4
    assert torch.isclose(mean_regulariser({}, batch, torch.tensor([1.0, 1.0]), 3.0), torch.tensor(7.5))
    model = MLP(2, 3, hidden=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    bias = torch.tensor([0.5, -1.0])
    x = torch.randn(5, 2)
    shifted = model.head(model.features(x) + bias)
    from torch.func import functional_call

    folded = functional_call(model, fold_bias(model, params, bias), (x,))
    assert torch.allclose(shifted, folded, atol=1e-6)


def test_dbe_training_adds_the_bias_to_the_features():
    """The bias gets the gradient of CE(h(f(x) + b)): one plain SGD step moves it by -lr * W^T dCE/dlogits."""
    torch.manual_seed(0)
    model = MLP(2, 3, hidden=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 2), torch.tensor([0, 1, 2, 0])
    b = torch.tensor([0.2, -0.1])
    cfg = TrainConfig(lr=0.1, batch_size=4, epochs=1)
    res = sgd_train(model, {**params, PRBM: b}, x, y, cfg, torch.Generator().manual_seed(0), feature_shift=PRBM)
    bl = b.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model.head(model.features(x) + bl), y)
    (g,) = torch.autograd.grad(loss, [bl])
    assert torch.allclose(res.params[PRBM], b - 0.1 * g, atol=1e-6)


def test_dbe_with_its_terms_off_is_fedavg(tiny_fed):
    a = tiny_sim(tiny_fed, "dbe", {"kappa": 0.0, "prbm": False}, rounds=3, seed=2)
    b = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=2)
    a.run(), b.run()
    drop = {"bytes_up", "bytes_down"}  # DBE also sends the feature means
    strip = lambda h: [{k: v for k, v in m.items() if k not in drop} for m in without_timings(h)]  # noqa: E731
    assert strip(a.history) == strip(b.history)
    on = tiny_sim(tiny_fed, "dbe", rounds=3, seed=2)
    on.run()
    assert strip(on.history) != strip(b.history)


def test_dbe_bias_stays_on_the_client(tiny_fed):
    sim = tiny_sim(tiny_fed, "dbe", rounds=3)
    sim.run_round(), sim.run_round()
    assert sim.server["global_mean"] is not None
    msg = train_message(sim, 0)
    assert "global_mean" in msg.params("dbe")
    res = run_client(sim, 0, msg)
    reply, state = res.reply, res.state
    assert PRBM not in reply.params() and set(reply.params()) == set(sim.run_info.init_params)
    assert state["prbm"].abs().sum() > 0  # trained after the initialisation round
    assert set(reply.params("dbe")) == {"client_mean"}


# ---------------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("spec,options", [
    ("pfedhn", {"sequential": False, "inner_steps": 3, "embed_dim": 2}),
    ("pfedla", {"granularity": "tensor", "sequential": True, "sign": "literal", "hn_momentum": 0.5}),
    ("fedpac", {"centroids": "mean", "align_norm": "sum", "weight_eps": 0.05, "head_lr": 0.1}),
    ("fedpac", {"head_epochs": 0}),
    ("dbe", {"global_mean": "every"}),
])
def test_non_default_options_run_and_states_stay_data(spec, options, tiny_fed):
    from fedblend.common.codec import decode, encode
    from tests.helpers import same_state

    sim = tiny_sim(tiny_fed, spec, options, rounds=2, join_ratio=0.5)
    sim.run()
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0
    assert same_state(decode(encode(sim.server)), sim.server)


def test_dbe_global_mean_first_is_kept_and_every_refreshes(tiny_fed):
    first = tiny_sim(tiny_fed, "dbe", rounds=3)
    first.run_round()
    kept = first.server["global_mean"].clone()
    first.run_round()
    assert torch.equal(first.server["global_mean"], kept)
    every = tiny_sim(tiny_fed, "dbe", {"global_mean": "every"}, rounds=3)
    every.run_round()
    assert torch.equal(every.server["global_mean"], kept)
    every.run_round()
    assert not torch.equal(every.server["global_mean"], kept)


def test_dbe_on_the_vmap_backend_runs_its_shifted_specs_one_by_one(tiny_fed):
    from fedblend.core.vmap import VmapBackend

    a = tiny_sim(tiny_fed, "dbe", {"kappa": 0.0}, rounds=2, seed=1)
    b = tiny_sim(tiny_fed, "dbe", {"kappa": 0.0}, rounds=2, seed=1, backend=VmapBackend())
    a.run()
    with pytest.warns(RuntimeWarning, match="one by one"):
        b.run()
    for cid, st in a.store.states.items():
        assert torch.allclose(st["prbm"], b.store.states[cid]["prbm"], atol=1e-6)
    for ma, mb in zip(a.history, b.history):
        assert ma["train_loss"] == pytest.approx(mb["train_loss"], rel=1e-5)
