"""FedAPA (Sun et al., IJCAI 2025): Eq. 5-7, post-processing and its ablations, partial model sharing,
partial participation, sequential server, heatmaps, end-to-end determinism."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from fedblend.algorithms.fedapa import FedAPA, FedAPAOptions, update_rows, weight_gradient
from fedblend.algorithms.parts.rows import aggregate_row
from fedblend.algorithms.registry import build_method
from fedblend.common.options import ConfigError
from fedblend.common.params import num_bytes
from fedblend.core.message import Message
from fedblend.results.heatmaps import same_class_mass
from tests.helpers import run_client, tiny_sim, train_message

RAW = FedAPAOptions(clip=False, self_weight=False, normalize=False)  # the bare Eq. 7 step


def proxy_loss(row, stack, theta_i):
    return 0.5 * float(((row @ stack - theta_i) ** 2).sum())


# ------------------------------------------------------------------------------------------ Eq. 5-7
def test_weight_gradient_matches_finite_difference():
    g = torch.Generator().manual_seed(0)
    stack = torch.randn(3, 5, generator=g, dtype=torch.float64)
    row = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    theta_i = torch.randn(5, generator=g, dtype=torch.float64)
    grad = weight_gradient(row, stack, theta_i)
    h = 1e-6
    fd = torch.zeros(3, dtype=torch.float64)
    for j in range(3):
        e = torch.zeros(3, dtype=torch.float64)
        e[j] = h
        fd[j] = (proxy_loss(row + e, stack, theta_i) - proxy_loss(row - e, stack, theta_i)) / (2 * h)
    assert torch.allclose(grad, fd, atol=1e-6)
    # and it is -(grad_A theta_bar)^T Delta theta of Eq. 6-7: (grad_A theta_bar)^T = Theta, Delta = theta - theta_bar
    delta = theta_i - row @ stack
    assert torch.allclose(grad, -(stack @ delta))


def test_update_sign_descent_vs_eq7_literal():
    g = torch.Generator().manual_seed(1)
    stack = torch.randn(3, 4, generator=g, dtype=torch.float64)
    row = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    theta_i = torch.randn(4, generator=g, dtype=torch.float64)
    grad = {0: weight_gradient(row, stack, theta_i)}
    before = proxy_loss(row, stack, theta_i)
    down, _ = update_rows(torch.eye(3, dtype=torch.float64), None, grad, {0: row}, replace(RAW, eta=1e-3))
    up, _ = update_rows(torch.eye(3, dtype=torch.float64), None, grad, {0: row},
                        replace(RAW, eta=1e-3, sign="eq7-literal"))
    assert proxy_loss(down[0], stack, theta_i) < before < proxy_loss(up[0], stack, theta_i)
    assert torch.allclose(down[0], row - 1e-3 * grad[0]) and torch.allclose(up[0], row + 1e-3 * grad[0])


def test_aggregate_row_is_eq5():
    thetas = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "b": torch.tensor([[1.0], [0.0], [2.0]])}
    out = aggregate_row(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), thetas)
    assert torch.allclose(out["w"], torch.tensor([2.5, 3.5])) and torch.allclose(out["b"], torch.tensor([1.0]))
    assert out["w"].dtype == torch.float32


# ------------------------------------------------------------------------------------------ post-processing
# Two clients, scalar parameters theta = (1, 3); client 0 got theta_bar = 1 (row e_0) and uploads 2.
# gradient = Theta (theta_bar - theta_0) = (1, 3) * (1 - 2) = (-1, -3); descent with eta 0.5:
# row = (1, 0) + 0.5 (1, 3) = (1.5, 1.5).
HAND = [
    ({}, [1 / 3, 2 / 3]),  # clip (1, 1) -> a_00 = 0.5 -> (0.5, 1) / 1.5
    ({"clip": False}, [0.25, 0.75]),  # (1.5, 1.5) -> (0.5, 1.5) / 2
    ({"self_weight": False}, [0.5, 0.5]),  # (1, 1) / 2
    ({"normalize": False}, [0.5, 1.0]),  # (1, 1) -> (0.5, 1)
    ({"clip": False, "self_weight": False, "normalize": False}, [1.5, 1.5]),  # "w/o All"
    ({"self_weight_rule": "one"}, [0.5, 0.5]),  # authors' code: a_00 = 1 -> (1, 1) / 2
    ({"mu": 0.0}, [0.0, 1.0]),  # (0, 1)
    ({"sign": "eq7-literal"}, [1.0, 0.0]),  # (1, 0) - 0.5 (1, 3) = (0.5, -1.5) -> (0.5, 0) -> (0.5, 0) / 0.5
]


@pytest.mark.parametrize("opts,expected", HAND)
def test_postprocessing_steps_and_ablation_switches(opts, expected):
    m = FedAPA(FedAPAOptions(eta=0.5, **opts))
    server = {"weights": torch.eye(2, dtype=torch.float64), "thetas": {"w": torch.tensor([[1.0], [3.0]])},
              "snapshots": {}}
    new = m.aggregate_train(server, {0: Message({"params": {"w": torch.tensor([2.0])}}, {"num_samples": 5})},
                            SimpleNamespace(rnd=0))
    assert torch.allclose(new["weights"][0], torch.tensor(expected, dtype=torch.float64))
    assert torch.equal(new["weights"][1], torch.tensor([0.0, 1.0], dtype=torch.float64))  # did not join
    assert torch.equal(new["thetas"]["w"], torch.tensor([[2.0], [3.0]]))  # upload stored, other kept
    assert torch.equal(server["weights"], torch.eye(2, dtype=torch.float64))  # input not modified
    assert 1 in new["snapshots"] and torch.allclose(new["snapshots"][1][0].double(), new["weights"][0])


def test_unnormalisable_row_falls_back_to_self():
    m = FedAPA(FedAPAOptions(eta=0.5, mu=0.0, sign="eq7-literal"))  # (0.5, 0) -> a_00 = 0 -> sum 0
    server = {"weights": torch.eye(2, dtype=torch.float64), "thetas": {"w": torch.tensor([[1.0], [3.0]])}}
    new = m.aggregate_train(server, {0: Message({"params": {"w": torch.tensor([2.0])}}, {"num_samples": 5})},
                            SimpleNamespace(rnd=5))
    assert torch.equal(new["weights"][0], torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_server_momentum_row_scope():
    # bare steps, eta 1: buf1 = g1, row1 = e0 - g1; buf2 = 0.9 g1 + g2, row2 = row1 - buf2
    opts = replace(RAW, eta=1.0, server_momentum=0.9)
    w0 = torch.eye(2, dtype=torch.float64)
    g1, g2 = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([-1.0, 0.5], dtype=torch.float64)
    w1, b1 = update_rows(w0, torch.zeros(2, 2, dtype=torch.float64), {0: g1}, {0: w0[0]}, opts)
    w2, b2 = update_rows(w1, b1, {0: g2}, {0: w1[0]}, opts)
    assert torch.allclose(w2[0], torch.tensor([1.0, 0.0]).double() - g1 - (0.9 * g1 + g2))
    assert torch.equal(w2[1], w0[1]) and torch.equal(b2[1], torch.zeros(2, dtype=torch.float64))


def test_server_momentum_matrix_scope_moves_other_rows_like_authors_code():
    # one optimizer over the whole matrix: client 1's step also moves row 0 by eta * 0.9 * buf_0
    opts = replace(RAW, eta=0.1, server_momentum=0.9, momentum_scope="matrix")
    w0 = torch.eye(2, dtype=torch.float64)
    g0, g1 = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([-3.0, -1.0], dtype=torch.float64)
    w1, b1 = update_rows(w0, torch.zeros(2, 2, dtype=torch.float64), {0: g0}, {0: w0[0]}, opts)
    w2, _ = update_rows(w1, b1, {1: g1}, {1: w1[1]}, opts)
    assert torch.allclose(w2[0], w1[0] - 0.1 * 0.9 * g0)
    assert torch.allclose(w2[1], w0[1] - 0.1 * g1)


def test_options_are_validated():
    with pytest.raises(ConfigError):
        build_method("fedapa", {"eta": -1.0})
    with pytest.raises(ConfigError):
        build_method("fedapa", {"sign": "up"})
    with pytest.raises(ConfigError):
        build_method("fedapa", {"server_momentum": 1.0})
    assert build_method("fedapa", {"heatmap_rounds": [2, 3]}).opts.heatmap_rounds == (2, 3)


# ------------------------------------------------------------------------------------------ with the engine
def test_init_identity_and_common_initial_model(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedapa")
    assert torch.equal(sim.server["weights"], torch.eye(4, dtype=torch.float64))
    body = sim.model.body_names()
    assert sorted(sim.server["thetas"]) == sorted(body)
    for cid in range(4):
        pay = train_message(sim, cid).params()
        assert all(torch.equal(pay[n], sim.run_info.init_params[n]) for n in body)


def _recording(sim):
    """Wrap the server half's training message to record payloads and the server state each was built from."""
    calls = []
    orig = sim.method.configure_train

    def configure_train(server, cid, sctx):
        msg = orig(server, cid, sctx)
        calls.append((cid, {k: v.clone() for k, v in server["thetas"].items()}, msg.params()))
        return msg

    sim.method.configure_train = configure_train
    return calls


@pytest.mark.parametrize("share", ["body", "all"])
def test_head_never_leaves_the_client(tiny_fed, share):
    sim = tiny_sim(tiny_fed, "fedapa", {"share": share}, rounds=2)
    calls = _recording(sim)
    sim.run()
    model, init = sim.model, sim.run_info.init_params
    shared = model.body_names() if share == "body" else list(init)
    assert all(sorted(pay) == sorted(shared) for _, _, pay in calls)
    assert sorted(sim.server["thetas"]) == sorted(shared)
    for m in sim.history:
        assert m["bytes_down"] == [num_bytes({n: init[n] for n in shared})] * len(m["selected"])
        assert m["bytes_up"] == m["bytes_down"]
    cstate = sim.store.get(0)
    up = run_client(sim, 0, train_message(sim, 0), rnd=5).reply
    assert sorted(up.params()) == sorted(shared)
    head = model.head_names()
    if share == "body":  # the private head was trained and is kept in the client state only
        assert not any(torch.equal(cstate["params"][n], init[n]) for n in head)
        assert not set(head) & set(sim.server["thetas"])


@pytest.mark.parametrize("sequential", [False, True])
def test_non_participant_row_and_params_untouched(tiny_fed, sequential):
    sim = tiny_sim(tiny_fed, "fedapa", {"sequential": sequential, "eta": 0.05}, rounds=3, join_ratio=0.5)
    sim.run_round()
    sim.run_round()  # rows are no longer the identity
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in sim.server.items()}
    thetas_before = {n: t.clone() for n, t in sim.server["thetas"].items()}
    metrics = sim.run_round()
    skipped = sorted(set(range(4)) - set(metrics["selected"]))
    assert skipped and len(metrics["selected"]) == 2
    for cid in skipped:
        assert torch.equal(sim.server["weights"][cid], before["weights"][cid])
        for n, t in thetas_before.items():
            assert torch.equal(sim.server["thetas"][n][cid], t[cid])
    for cid in metrics["selected"]:  # participants did move (uploads stored)
        assert any(not torch.equal(sim.server["thetas"][n][cid], t[cid]) for n, t in thetas_before.items())


def test_sequential_server_later_clients_see_earlier_uploads(tiny_fed):
    for sequential in (False, True):
        sim = tiny_sim(tiny_fed, "fedapa", {"sequential": sequential}, rounds=1)
        assert sim.method.traits.sequential_server is sequential
        calls = _recording(sim)
        sim.run_round()
        first = calls[0][0]
        seen = calls[1][1]  # stored thetas when the second client's payload was made
        changed = any(not torch.equal(seen[n][first], sim.run_info.init_params[n]) for n in seen)
        assert changed is sequential


def test_end_to_end_deterministic_and_learns(tiny_fed, tmp_path):
    runs = []
    for _ in range(2):
        sim = tiny_sim(tiny_fed, "fedapa", {"eta": 0.05, "heatmap_rounds": [1, 3]}, rounds=3)
        runs.append((sim.run(), sim))
    (h1, s1), (h2, s2) = runs
    assert [m["acc"] for m in h1] == [m["acc"] for m in h2]
    assert torch.equal(s1.server["weights"], s2.server["weights"])
    w = s1.server["weights"]
    assert torch.all((w >= 0) & (w <= 1)) and torch.allclose(w.sum(1), torch.ones(4, dtype=torch.float64))
    assert not torch.equal(w, torch.eye(4, dtype=torch.float64))  # weights were learned
    assert "global_acc" not in h1[-1] and h1[-1]["acc"] > 0.3
    assert sorted(s1.server["snapshots"]) == [1, 3]
    s1.save(tmp_path / "checkpoint.pt")
    from fedblend.core.diagnostics import RunFiles, diagnostics_of
    from fedblend.results.diagnostics import render

    items = [i for fn in diagnostics_of(s1.method) for i in fn(RunFiles(tmp_path, s1.method))]
    assert [i.name for i in items] == ["fedapa_weights_round0001", "fedapa_weights_round0003", "fedapa_weights_latest"]
    assert torch.equal(items[-1].matrix, s1.method.effective_weights(s1.server))
    assert torch.equal(items[0].matrix, s1.server["snapshots"][1])
    for item in items:
        render(item, tmp_path, tmp_path / "fig")
    assert all((tmp_path / "fig" / f"{i.name}.png").stat().st_size > 1000 for i in items)


def test_authors_code_variant_runs(tiny_fed):
    opts = {"sequential": True, "self_weight_rule": "one", "server_momentum": 0.9, "momentum_scope": "matrix",
            "eta": 0.05}
    sim = tiny_sim(tiny_fed, "fedapa", opts, rounds=2)
    hist = sim.run()
    eff = sim.method.effective_weights(sim.server)  # rows as the next downlink uses them (lazy a_ii = 1, normalise)
    assert torch.allclose(eff.sum(1), torch.ones(4, dtype=torch.float64))
    assert torch.all(sim.server["weights"] >= 0) and torch.all(sim.server["weights"] <= 1)
    assert "momentum" in sim.server and hist[-1]["acc"] > 0.3


def test_same_class_mass_by_hand():
    # clients 0, 1 share class 0; client 2 holds class 1 only
    counts = [[5, 0], [3, 0], [0, 4]]
    w = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]])
    out = same_class_mass(w, counts)
    # client 0: 0.3 / 0.5; client 1: 0.1 / 0.4; client 2: 0 / 0.5
    assert out["same_class_mass"] == pytest.approx((0.6 + 0.25 + 0.0) / 3)
    assert out["chance_level"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert out["mean_self_weight"] == pytest.approx((0.5 + 0.6 + 0.5) / 3)
