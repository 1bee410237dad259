"""Per-FedAvg, pFedMe, FedFomo and PartialFed: their core updates on hand-computed or closed-form toy cases, and
their reductions (the shared contract suite covers checkpoints, isolation, backends and ``+ala``)."""

import pytest
import torch
from torch import nn

from fedblend.algorithms import build_method
from fedblend.algorithms.fedfomo import fomo_update, fomo_weights, select_models
from fedblend.algorithms.partialfed import gumbel_relax, mix, partial_load, strategy_step
from fedblend.algorithms.parts.ownloop import batch_loss, grad
from fedblend.algorithms.perfedavg import meta_step
from fedblend.algorithms.pfedme import inner_solve, local_step, server_mix
from fedblend.common.params import weighted_average
from fedblend.core.message import Message
from tests.helpers import tiny_sim

pytestmark = pytest.mark.usefixtures("one_thread")


def toy():
    """A tiny float64 linear model, its parameters and three batches."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    params = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in model.named_parameters()}
    data = [(torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g))
            for _ in range(3)]
    return model, params, data


# ------------------------------------------------------------------------------------------------ Per-FedAvg
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


# ------------------------------------------------------------------------------------------------ pFedMe
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
    assert sim.method.personalized_params(Message(), st, None) is st["theta"]


# ------------------------------------------------------------------------------------------------ FedFomo
def test_fedfomo_weights_by_hand():
    w = fomo_weights(1.0, [0.5, 1.2, 0.8], [2.0, 1.0, 0.5])
    raw = torch.tensor([0.5 / 2.0, 0.0, 0.2 / 0.5], dtype=torch.float64)  # max(L_i - L_n, 0) / ||theta_n - theta_i||
    assert torch.allclose(w, raw / raw.sum())
    assert torch.equal(fomo_weights(1.0, [1.5, 1.0], [1.0, 1.0]), torch.zeros(2, dtype=torch.float64))


def test_fedfomo_update_by_hand():
    own = {"a": torch.tensor([0.0, 0.0])}
    models = [{"a": torch.tensor([1.0, 0.0])}, {"a": torch.tensor([0.0, 2.0])}]
    out = fomo_update(own, models, torch.tensor([0.25, 0.75]))
    assert torch.allclose(out["a"], torch.tensor([0.25, 1.5]))
    assert torch.equal(fomo_update(own, models, torch.zeros(2))["a"], own["a"])


def test_fedfomo_selection_top_m_and_exploration():
    aff = torch.tensor([0.0, 0.5, 0.1, 0.9, 0.2], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    assert select_models(aff, [1, 2, 3, 4], 2, 0.0, gen) == [1, 3]
    assert select_models(aff, [2], 5, 0.0, gen) == [2]
    picks = {tuple(select_models(aff, [1, 2, 3, 4], 2, 1.0, gen)) for _ in range(30)}
    assert len(picks) > 1 and all(len(p) == 2 and set(p) <= {1, 2, 3, 4} for p in picks)


def test_fedfomo_sends_m_other_models_and_counts_their_bytes(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=3, seed=0)
    sim.run()
    model_bytes = sum(t.numel() * t.element_size() for t in sim.run_info.init_params.values())
    assert sim.history[0]["bytes_down"] == [0] * 4  # nothing stored before the first uploads
    assert sim.history[1]["bytes_down"] == [2 * model_bytes] * 4
    assert sim.history[1]["bytes_up"] == [model_bytes] * 4
    assert float(sim.server["affinity"].diagonal().abs().sum()) == 0.0  # a client never receives its own model
    assert float(sim.server["affinity"].sum()) > 0


# ------------------------------------------------------------------------------------------------ PartialFed
def test_partialfed_loads_global_layers_and_keeps_local_ones():
    glob = {"fc1.weight": torch.ones(2, 2), "fc1.bias": torch.ones(2), "fc2.weight": torch.ones(1, 2)}
    local = {k: torch.zeros_like(v) for k, v in glob.items()}
    out = partial_load(glob, local, {"fc1": True, "fc2": False})
    assert out["fc1.weight"] is glob["fc1.weight"] and out["fc1.bias"] is glob["fc1.bias"]
    assert out["fc2.weight"] is local["fc2.weight"]
    per_tensor = partial_load(glob, local, {"fc1.weight": False, "fc1.bias": True, "fc2.weight": True}, "tensor")
    assert [per_tensor[k] is glob[k] for k in glob] == [False, True, True]


def test_partialfed_client_init_thresholds_the_strategy(tiny_fed):
    sim = tiny_sim(tiny_fed, "partialfed", rounds=1)
    names = list(sim.run_info.init_params)
    glob = {k: torch.ones_like(v) for k, v in sim.run_info.init_params.items()}
    local = {k: torch.zeros_like(v) for k, v in glob.items()}
    layers = sorted({k.rsplit(".", 1)[0] for k in names})
    s = {ly: torch.tensor(0.7 if i % 2 == 0 else 0.2) for i, ly in enumerate(layers)}
    init = sim.method.client_init(Message({"params": glob}), {"params": local, "strategy": s}, None)
    for k in names:
        assert torch.equal(init[k], glob[k] if float(s[k.rsplit(".", 1)[0]]) >= 0.5 else local[k]), k


def test_partialfed_strategy_step_is_the_layer_mean_gradient():
    model, glob, data = toy()
    local = {k: v * 0.3 - 0.1 for k, v in glob.items()}
    f = batch_loss(model, *data[0])
    s = {"0": torch.tensor(0.6, dtype=torch.float64), "2": torch.tensor(0.4, dtype=torch.float64)}
    leaf = {u: v.clone().requires_grad_(True) for u, v in s.items()}
    ds = torch.autograd.grad(f(mix(glob, local, leaf)), [leaf["0"], leaf["2"]])
    numel = {u: sum(v.numel() for k, v in glob.items() if k.startswith(u + ".")) for u in s}
    new = strategy_step(s, glob, local, f, eta=0.5, unit="layer")
    for u, d in zip(["0", "2"], ds):
        assert torch.allclose(new[u], (s[u] - 0.5 * d / numel[u]).clamp(0, 1)), u
    cold = gumbel_relax(s, 1e-3, torch.Generator().manual_seed(0))
    assert all(min(float(v), 1 - float(v)) < 1e-6 for v in cold.values())  # low temperature: a hard choice


def test_partialfed_first_round_is_fedavg_and_learns_later(tiny_fed):
    a = tiny_sim(tiny_fed, "partialfed", rounds=3, seed=2)
    b = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=2)
    a.run_round(), b.run_round()
    assert all(torch.equal(a.server["global"][k], b.server["global"][k]) for k in a.server["global"])
    a.run_round()
    assert any(int(st["rounds"]) > 0 for st in a.store.states.values())


def test_registered_with_ala_where_the_paper_has_a_global_model():
    for m in ("perfedavg", "pfedme", "partialfed"):
        assert build_method(f"{m}+ala").label == f"{m}+ala"
    with pytest.raises(ValueError, match="no global model"):
        build_method("fedfomo+ala")



@pytest.mark.parametrize("method,options", [
    ("perfedavg", {"variant": "hf", "local_steps": 3}),
    ("pfedme", {"inner_init": "w", "local_steps": 4, "beta": 2.0}),
    ("fedfomo", {"candidates": "last_round", "val_split": "train", "m": 1, "epsilon": 1.0}),
    ("partialfed", {"load": "soft", "unit": "tensor", "gumbel": False}),
])
def test_non_default_options_train_and_resume(method, options, tiny_fed, tmp_path):
    from tests.helpers import same_state, without_timings

    sim = tiny_sim(tiny_fed, method, options, rounds=3, seed=1, join_ratio=0.5)
    sim.run_round(), sim.run_round()
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, method, options, rounds=3, seed=1, join_ratio=0.5)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server) and same_state(twin.store.states, sim.store.states)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0 and sim.history[-1]["train_loss"] == sim.history[-1]["train_loss"]
