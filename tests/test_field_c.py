"""FedPHP, FedAMP, APPLE, FedProto, FedGH (issue #12, the FedAPA Table 1 field): each paper's core equation on a
hand-computed toy case, the reductions to Local / FedAvg where a coefficient at 0 gives one, and what travels in
the messages. The shared contract suite (tests/test_shared_suite.py) covers checkpoints, resume, isolation and
the process backend for every registered method."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.apple import apple_step, data_prior, mixture, prior_weight
from fedblend.algorithms.fedamp import attention_weights
from fedblend.algorithms.fedgh import header_step
from fedblend.algorithms.fedphp import FedPHPOptions, hpm_momentum, mmd, moving_average, transfer_loss
from fedblend.algorithms.fedproto import average_prototypes, prototype_head, prototype_loss
from fedblend.algorithms.parts.prototypes import class_prototypes
from fedblend.core.training import Batch
from tests.helpers import run_client, same_state, tiny_sim, train_message, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


def client_params(sim):
    return {c: s["params"] for c, s in sim.store.states.items()}


# ------------------------------------------------------------------------------------------------ FedAMP
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


# ------------------------------------------------------------------------------------------------ FedProto
def test_fedproto_prototypes_and_average_by_hand():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]])
    protos, counts = class_prototypes(feats, torch.tensor([0, 0, 2]))
    assert counts == {"0": 2, "2": 1}
    assert torch.equal(protos["0"], torch.tensor([2.0, 1.0])) and torch.equal(protos["2"], torch.tensor([0.0, 4.0]))
    up = [({"0": torch.tensor([1.0, 0.0]), "1": torch.tensor([5.0, 5.0])}, {"0": 1, "1": 2}),
          ({"0": torch.tensor([3.0, 2.0])}, {"0": 3})]
    avg = average_prototypes(up, "samples")  # Eq. 6: weights |D_ij| / N_j
    assert torch.allclose(avg["0"], torch.tensor([2.5, 1.5])) and torch.allclose(avg["1"], torch.tensor([5.0, 5.0]))
    uni = average_prototypes(up, "uniform")  # the authors' code
    assert torch.allclose(uni["0"], torch.tensor([2.0, 1.0]))


def test_fedproto_regulariser_by_hand():
    feats = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    batch = Batch(torch.zeros(2, 1), torch.tensor([0, 1]), torch.zeros(2, 2), feats)
    protos = torch.tensor([[0.0, 0.0], [9.0, 9.0]])
    mask = torch.tensor([1.0, 0.0])  # class 1 has no global prototype: no pull
    assert float(prototype_loss({}, batch, protos, mask, 2.0, "mse")) == pytest.approx(2.0 * (0.5 + 0) / 2)
    assert float(prototype_loss({}, batch, protos, mask, 2.0, "sq_l2")) == pytest.approx(2.0 * (1.0 + 0) / 2)


def test_fedproto_prototype_head_is_nearest_prototype(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedproto", rounds=1)
    model = sim.model
    g = torch.Generator().manual_seed(0)
    d = model.fc2.in_features
    protos = {str(c): torch.randn(d, generator=g) for c in (0, 1, 3)}
    head = prototype_head(model, protos, model.fc2.out_features)
    f = torch.randn(50, d, generator=g)
    logits = functional_call(model, head, (f,), {"part": "head"})
    mat = torch.stack([protos[c] for c in ("0", "1", "3")])
    dist = torch.cdist(f, mat) ** 2
    assert torch.equal(logits.argmax(1), torch.tensor([0, 1, 3])[dist.argmin(1)])
    # the same softmax as the distance classifier -||f - C_j||^2 over the classes that have a prototype
    assert torch.allclose(F.softmax(logits, 1)[:, [0, 1, 3]], F.softmax(-dist, 1), atol=1e-5)


def test_fedproto_lambda_zero_with_own_head_is_local(tiny_fed):
    a = tiny_sim(tiny_fed, "fedproto", {"lam": 0.0, "eval": "head"}, rounds=3, seed=2, join_ratio=0.75)
    b = tiny_sim(tiny_fed, "local", rounds=3, seed=2, join_ratio=0.75)
    a.run(), b.run()
    assert same_state(client_params(a), client_params(b))
    assert [m["acc"] for m in a.history] == [m["acc"] for m in b.history]
    c = tiny_sim(tiny_fed, "fedproto", {"lam": 1.0, "eval": "head"}, rounds=3, seed=2, join_ratio=0.75)
    c.run()
    assert not same_state(client_params(c), client_params(b))


def test_fedproto_only_prototypes_travel(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedproto", rounds=3, seed=0)
    assert train_message(sim, 0).arrays == {}  # nothing to send before the first aggregation
    sim.run_round()
    msg = train_message(sim, 0)
    assert set(msg.arrays) == {"protos"}
    res = run_client(sim, 0, msg)
    assert set(res.reply.arrays) == {"protos"}
    d = sim.model.fc2.in_features
    counts = res.reply.metrics["class_counts"]
    y = tiny_fed.clients[0].train_y
    assert counts == {str(c): int((y == c).sum()) for c in torch.unique(y).tolist()}
    assert res.reply.num_bytes == 4 * d * len(counts)  # one float32 d-vector per class the client holds
    assert all(v.shape == (d,) for v in res.reply.params("protos").values())
    h = sim.history[0]
    fedavg = tiny_sim(tiny_fed, "fedavg", rounds=1, seed=0)
    fedavg.run_round()
    assert max(h["bytes_up"]) < min(fedavg.history[0]["bytes_up"]) / 10


# ------------------------------------------------------------------------------------------------ FedGH
def test_fedgh_header_step_by_hand(tiny_fed):
    model = tiny_sim(tiny_fed, "fedgh", rounds=1).model
    g = torch.Generator().manual_seed(1)
    c, d = model.fc2.out_features, model.fc2.in_features
    head = {"fc2.weight": torch.randn(c, d, generator=g), "fc2.bias": torch.randn(c, generator=g)}
    feats, labels = torch.randn(5, d, generator=g), torch.tensor([0, 1, 1, 3, 0])
    new, buf, loss = header_step(model, head, feats, labels, lr=0.1)
    logits = feats @ head["fc2.weight"].T + head["fc2.bias"]
    err = (F.softmax(logits, 1) - F.one_hot(labels, c).float()) / len(labels)  # dCE/dlogits, mean over the batch
    assert torch.allclose(new["fc2.weight"], head["fc2.weight"] - 0.1 * err.T @ feats, atol=1e-6)
    assert torch.allclose(new["fc2.bias"], head["fc2.bias"] - 0.1 * err.sum(0), atol=1e-6)
    assert loss == pytest.approx(float(F.cross_entropy(logits, labels)), rel=1e-5) and buf is None
    # momentum: b = m b + g, the torch.optim.SGD rule
    new2, buf2, _ = header_step(model, new, feats, labels, lr=0.1, momentum=0.5, buf={"fc2.bias": err.sum(0)})
    logits2 = feats @ new["fc2.weight"].T + new["fc2.bias"]
    err2 = (F.softmax(logits2, 1) - F.one_hot(labels, c).float()) / len(labels)
    assert torch.allclose(buf2["fc2.bias"], 0.5 * err.sum(0) + err2.sum(0), atol=1e-6)
    assert torch.allclose(new2["fc2.bias"], new["fc2.bias"] - 0.1 * buf2["fc2.bias"], atol=1e-6)


def test_fedgh_prototypes_up_header_down(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedgh", rounds=3, seed=0)
    head_names = sim.model.head_names()
    msg = train_message(sim, 1)
    assert set(msg.arrays) == {"header"} and sorted(msg.params("header")) == sorted(head_names)
    res = run_client(sim, 1, msg)
    assert set(res.reply.arrays) == {"protos"}
    sim.run_round()
    # the server trained its header on the uploads; every client now receives it and evaluates with it
    assert not same_state(sim.server["header"], msg.params("header"))
    ev = sim.method.configure_evaluate(sim.server, 1, sim.sctx(1))
    params = sim.method.eval_params(ev, sim.store.get(1), sim.client_ctx(1, 1, "evaluate"))
    assert all(torch.equal(params[n], sim.server["header"][n]) for n in head_names)
    body = [n for n in params if n not in head_names]
    assert all(torch.equal(params[n], sim.store.get(1)["params"][n]) for n in body)
    # the client trains from its own body under the received header (header substitution)
    start = sim.method.client_init(ev, sim.store.get(1), sim.client_ctx(1, 1))
    assert all(torch.equal(start[n], sim.server["header"][n]) for n in head_names)


def test_fedgh_server_momentum_is_state_and_resumes(tiny_fed, tmp_path):
    sim = tiny_sim(tiny_fed, "fedgh", {"server_momentum": 0.9}, rounds=3, seed=3)
    sim.run_round()
    assert set(sim.server["header_momentum"]) == set(sim.model.head_names())
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, "fedgh", {"server_momentum": 0.9}, rounds=3, seed=3)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)


# ------------------------------------------------------------------------------------------------ FedPHP
def test_fedphp_moving_average_and_schedule_by_hand():
    hpm, w = {"a": torch.tensor([1.0, 2.0])}, {"a": torch.tensor([3.0, 6.0])}
    assert torch.allclose(moving_average(hpm, w, 0.25)["a"], torch.tensor([2.5, 5.0]))  # 0.25 v + 0.75 w
    o = FedPHPOptions(mu=0.9, expected_join=0.5)
    assert hpm_momentum(o, 0, 3, 10) == 0.0  # first participation: the HPM becomes the trained model
    assert hpm_momentum(o, 2, 3, 10) == pytest.approx(0.9 * 2 / 5)
    assert hpm_momentum(o, 9, 3, 10) == pytest.approx(0.9)  # capped at mu
    assert hpm_momentum(FedPHPOptions(mu=0.9, schedule="round"), 5, 4, 10) == pytest.approx(0.36)


def test_fedphp_transfer_losses_by_hand(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedphp", rounds=1)
    model, init = sim.model, sim.run_info.init_params
    x, y = tiny_fed.clients[0].train_x[:6], tiny_fed.clients[0].train_y[:6]
    student = {k: v + 0.1 for k, v in init.items()}
    logits = functional_call(model, student, (x,))
    teacher = functional_call(model, init, (x,))
    batch = Batch(x, y, logits, None)
    got = transfer_loss(student, batch, model, init, 0.3, "kd", 4.0)
    kd = -(F.softmax(teacher / 4.0, 1) * F.log_softmax(logits, 1)).sum(1).mean()
    assert float(got) == pytest.approx(float(0.3 * (kd - F.cross_entropy(logits, y))), rel=1e-5)
    # MMD: zero for identical samples, positive otherwise, symmetric
    a, b = torch.randn(8, 3), torch.randn(8, 3) + 2.0
    assert float(mmd(a, a)) == pytest.approx(0.0, abs=1e-6) and float(mmd(a, b)) > 0.1
    assert float(mmd(a, b)) == pytest.approx(float(mmd(b, a)), rel=1e-5)


def test_fedphp_without_transfer_and_momentum_is_fedavg(tiny_fed):
    a = tiny_sim(tiny_fed, "fedphp", {"lam": 0.0, "mu": 0.0}, rounds=3, seed=5, join_ratio=0.75)
    b = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=5, join_ratio=0.75)
    a.run(), b.run()
    assert same_state(a.server["global"], b.server["global"])
    assert [m["global_acc"] for m in a.history] == [m["acc"] for m in b.history]
    # the HPM is then the client's last trained model
    res = run_client(a, 1, train_message(a, 1))
    assert same_state(res.state["hpm"], res.reply.params())
    c = tiny_sim(tiny_fed, "fedphp", {"lam": 0.5, "mu": 0.9}, rounds=3, seed=5, join_ratio=0.75)
    c.run()
    assert not same_state(c.server["global"], b.server["global"])


def test_fedphp_hpm_update_on_the_client(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedphp", {"mu": 0.8, "expected_join": 0.5}, rounds=4, seed=1)
    sim.run_round(), sim.run_round()
    st = sim.store.get(0)
    assert st["joins"] == 2
    res = run_client(sim, 0, train_message(sim, 0))
    mu_i = 0.8 * 2 / 2  # k_i = 2 earlier participations, floor(0.5 * 4) = 2 expected
    want = moving_average(st["hpm"], res.reply.params(), min(mu_i, 0.8))
    assert same_state(res.state["hpm"], want)
    assert set(res.reply.arrays) == {"params"} and "hpm" not in res.reply.params()


# ------------------------------------------------------------------------------------------------ APPLE
def test_apple_mixture_prior_and_schedule_by_hand():
    cores = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 8.0]])}
    assert torch.allclose(mixture(torch.tensor([0.25, 0.75, 0.0]), cores)["w"], torch.tensor([2.5, 3.5]))
    assert torch.allclose(mixture(torch.tensor([0.5, 0.0, 0.5]), cores)["w"], torch.tensor([0.5, 5.0]))
    assert torch.allclose(data_prior(torch.tensor([0.0, 10.0, 30.0])),
                          torch.tensor([20.0, 10.0, 30.0], dtype=torch.float64) / 60)
    assert torch.allclose(data_prior(torch.zeros(4)), torch.full((4,), 0.25, dtype=torch.float64))
    assert prior_weight(0, 10, "cos") == 1.0 and prior_weight(5, 10, "cos") == pytest.approx(0.5)
    assert prior_weight(10, 10, "cos") == 0.0 and prior_weight(4, 10, "linear") == pytest.approx(0.6)


def test_apple_step_gradients_by_hand(tiny_fed):
    """Eq. 3-5: dL/dc_i = p_ii dCE/dw, dL/dp_j = <dCE/dw, c_j> + lambda mu (p_j - p0_j)."""
    sim = tiny_sim(tiny_fed, "apple", rounds=1)
    model, init = sim.model, sim.run_info.init_params
    g = torch.Generator().manual_seed(0)
    cores = {k: torch.stack([v + 0.1 * torch.randn(v.shape, generator=g) for _ in range(3)]) for k, v in init.items()}
    own = {k: v[1].clone() for k, v in cores.items()}
    dr, prior = torch.tensor([0.2, 0.5, 0.3]), torch.tensor([0.3, 0.3, 0.4])
    x, y = tiny_fed.clients[0].train_x[:8], tiny_fed.clients[0].train_y[:8]
    new_own, new_dr, loss = apple_step(model, own, 1, cores, dr, prior, x, y, core_lr=0.5, dr_lr=0.1, lam_mu=0.2)
    w = {k: (dr.view(-1, *([1] * (v.dim() - 1))) * v).sum(0).requires_grad_(True) for k, v in cores.items()}
    ce = F.cross_entropy(functional_call(model, w, (x,)), y)
    gw = dict(zip(w, torch.autograd.grad(ce, list(w.values()))))
    assert loss == pytest.approx(float(ce.detach()), rel=1e-5)
    for k in own:
        assert torch.allclose(new_own[k], own[k] - 0.5 * dr[1] * gw[k], atol=1e-5), k
    gp = torch.tensor([sum(float((gw[k] * cores[k][j]).sum()) for k in gw) for j in range(3)])
    assert torch.allclose(new_dr, dr - 0.1 * (gp + 0.2 * (dr - prior)), atol=1e-5)


def test_apple_all_cores_down_own_core_up(tiny_fed):
    sim = tiny_sim(tiny_fed, "apple", rounds=3, seed=0)
    sim.run_round()
    msg = train_message(sim, 2)
    assert set(msg.arrays) == {"core_0", "core_1", "core_2", "core_3", "prior"}
    for j in range(4):
        assert all(torch.equal(msg.params(f"core_{j}")[n], sim.server["cores"][n][j]) for n in msg.params("core_0"))
    res = run_client(sim, 2, msg)
    assert set(res.reply.arrays) == {"params"} and same_state(res.reply.params(), res.state["core"])
    assert "dr" in res.state and "dr" not in res.reply.arrays  # the DR vector stays on the client
    model_bytes = sum(t.numel() * 4 for t in sim.run_info.init_params.values())
    assert sim.history[0]["bytes_down"][0] == 4 * model_bytes + 4 * 4 and sim.history[0]["bytes_up"][0] == model_bytes
    # the evaluated model is the client's mixture of the cores by its DR vector
    cores = {n: torch.stack([msg.params(f"core_{j}")[n] for j in range(4)]) for n in msg.params("core_0")}
    for n in cores:
        cores[n][2] = res.state["core"][n]
    assert same_state(mixture(res.state["dr"], cores), res.state["params"])


# ------------------------------------------------------------------------------------------------ backends
@pytest.mark.parametrize("spec", ["fedproto", "fedphp"])
def test_vmap_backend_runs_batch_reading_terms_one_by_one(spec, tiny_fed):
    """Loss terms that read the batch (prototype pull, distillation) take the sequential path under ``vmap``
    (equal to ``sequential`` up to the float reassociation of vmap's batched rounds and evaluation)."""
    from fedblend.core.vmap import VmapBackend

    a = tiny_sim(tiny_fed, spec, rounds=2, seed=1)
    a.run()
    with pytest.warns(RuntimeWarning, match="looks at the batch"):
        b = tiny_sim(tiny_fed, spec, rounds=2, seed=1, backend=VmapBackend())
        b.run()
    for x, y in zip(without_timings(a.history), without_timings(b.history), strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert y[k] == (pytest.approx(x[k], rel=1e-5) if isinstance(x[k], float) else x[k]), k
