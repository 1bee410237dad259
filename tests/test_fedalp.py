"""FedALP (Xie et al. 2022): layer weights (Eq. 6-8), layer mixing (Eq. 9), group / global aggregation
(Algorithm 1 lines 10-11), Ward clustering (Algorithm 2), beta = 0 == FedAvg, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedblend.algorithms import build_method
from fedblend.algorithms.fedalp.clustering import (
    adjusted_rand_index,
    clustering_report,
    cosine_similarity,
    cut,
    leaf_order,
    similarity_to_distance,
    ward_groups,
    ward_linkage,
)
from fedblend.algorithms.fedalp.layer_mix import global_from_groups, layer_weights, mix_by_layer
from fedblend.common.options import ConfigError
from fedblend.common.params import flatten
from fedblend.common.rng import SeedTree
from fedblend.core.method import Message, RunInfo, ServerCtx, server_tree
from fedblend.core.training import TrainConfig
from tests.helpers import tiny_sim


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


# ------------------------------------------------------------------------------------------------ Eq. 6-8
def test_layer_weights_norm_over_weight_and_bias_together():
    # fc1: ||(3, 0, 0, 0) ++ (4, 0)|| = 5 ; fc2: ||(1, 0) ++ (0)|| = 1  -> Psi = beta * (5, 1) / 5
    upd = {"fc1.weight": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "fc1.bias": t(4.0, 0.0),
           "fc2.weight": torch.tensor([[1.0, 0.0]]), "fc2.bias": t(0.0)}
    psi = layer_weights(upd, beta=0.5)
    assert psi == pytest.approx({"fc1": 0.5, "fc2": 0.1})
    # one weight per tensor: deltas (3, 4, 1, 0) -> beta * delta / 4
    psi_t = layer_weights(upd, beta=0.5, unit="tensor")
    assert psi_t == pytest.approx({"fc1.weight": 0.375, "fc1.bias": 0.5, "fc2.weight": 0.125, "fc2.bias": 0.0})


def test_layer_weights_zero_update_and_beta_zero():
    upd = {"fc1.weight": torch.zeros(2, 2), "fc2.weight": torch.zeros(1, 2)}
    assert layer_weights(upd, beta=0.6) == {"fc1": 0.0, "fc2": 0.0}
    upd["fc2.weight"] += 1.0
    assert layer_weights(upd, beta=0.0) == {"fc1": 0.0, "fc2": 0.0}


# ------------------------------------------------------------------------------------------------ Eq. 9
def test_mix_by_layer():
    group = {"fc1.weight": torch.full((2, 2), 2.0), "fc1.bias": t(2.0, 2.0), "fc2.weight": t(10.0, -10.0)}
    glob = {"fc1.weight": torch.full((2, 2), 6.0), "fc1.bias": t(6.0, 6.0), "fc2.weight": t(0.0, 0.0)}
    out = mix_by_layer(group, glob, {"fc1": 0.25, "fc2": 1.0})
    assert torch.allclose(out["fc1.weight"], torch.full((2, 2), 0.25 * 2 + 0.75 * 6))  # = 5
    assert torch.allclose(out["fc1.bias"], t(5.0, 5.0))
    assert torch.equal(out["fc2.weight"], t(10.0, -10.0))
    zero = mix_by_layer(group, glob, {"fc1": 0.0, "fc2": 0.0})
    assert all(torch.equal(zero[k], glob[k]) for k in glob)
    assert zero["fc1.bias"] is not glob["fc1.bias"]  # a copy, never the global tensor itself


# ------------------------------------------------------------------------------------------------ Alg. 1 lines 10-11
def _sctx(num_clients=4, rnd=5, rounds=10):
    init = {"fc1.weight": t(0.0, 0.0), "fc2.weight": t(0.0)}
    run = RunInfo(model=None, init_params=init, train=TrainConfig(), num_clients=num_clients, rounds=rounds, seed=0)
    return ServerCtx(run, rnd, server_tree(SeedTree(0), rnd))


def _replies(uploads):
    """``{cid: (params, num_samples)}`` as the messages clients send back."""
    return {c: Message({"params": p}, {"num_samples": n}) for c, (p, n) in uploads.items()}


def _hier_server():
    """After T_pre: two groups; the server has received every client's data size with its earlier uploads."""
    return {
        "num_samples": {0: 100, 1: 300, 2: 200, 3: 200},
        "global": {"fc1.weight": t(1.0, 1.0), "fc2.weight": t(1.0)},
        "groups": [0, 0, 1, 1],
        "group_models": [{"fc1.weight": t(2.0, 0.0), "fc2.weight": t(4.0)},
                         {"fc1.weight": t(0.0, 2.0), "fc2.weight": t(-2.0)}],
        "psi": [{"fc1": 0.5, "fc2": 1.0}, {"fc1": 0.0, "fc2": 0.5}],
        "last_update": {}, "clusterings": [],
    }


def _three_uploads():
    """Clients 0, 1 (group 0) and 2 (group 1) joined; client 3 did not. Updates from their W_new: client 0
    (4, 0 | 0), client 1 (0, 0 | 8), client 2 (0, 3 | 0)."""
    return _replies({
        0: ({"fc1.weight": t(1.5 + 4.0, 0.5), "fc2.weight": t(4.0)}, 100),
        1: ({"fc1.weight": t(1.5, 0.5), "fc2.weight": t(4.0 + 8.0)}, 300),
        2: ({"fc1.weight": t(1.0, 1.0 + 3.0), "fc2.weight": t(-0.5)}, 200),
    })


def test_group_and_global_aggregation_literal():
    m = build_method("fedalp", {"t_pre": 2})
    server = _hier_server()
    sctx = _sctx()
    # W_new of group 0: fc1 = .5*(2,0) + .5*(1,1) = (1.5, .5); fc2 = 4.  Group 1: fc1 = (1,1); fc2 = .5*-2+.5*1 = -.5
    assert torch.allclose(m.configure_train(server, 0, sctx).params()["fc1.weight"], t(1.5, 0.5))
    assert torch.allclose(m.configure_train(server, 2, sctx).params()["fc2.weight"], t(-0.5))
    uploads = _three_uploads()
    new = m.aggregate_train(server, uploads, sctx)
    # group 0: w_0 + (100 * (4, 0 | 0) + 300 * (0, 0 | 8)) / 400 = (2 + 1, 0 | 4 + 6)
    assert torch.allclose(new["group_models"][0]["fc1.weight"], t(3.0, 0.0))
    assert torch.allclose(new["group_models"][0]["fc2.weight"], t(10.0))
    # group 1: only client 2 joined: w_1 + (0, 3 | 0)
    assert torch.allclose(new["group_models"][1]["fc1.weight"], t(0.0, 5.0))
    assert torch.allclose(new["group_models"][1]["fc2.weight"], t(-2.0))
    # global: group shares from ALL members' data: 400 / 800 and 400 / 800
    assert torch.allclose(new["global"]["fc1.weight"], t(1.5, 2.5))
    assert torch.allclose(new["global"]["fc2.weight"], t(4.0))
    assert torch.equal(server["group_models"][0]["fc1.weight"], t(2.0, 0.0))  # input state not mutated


def test_group_update_mixed_start_variant():
    m = build_method("fedalp", {"t_pre": 2, "group_update": "mixed_start"})
    server = _hier_server()
    sctx = _sctx()
    uploads = _replies({0: ({"fc1.weight": t(1.5 + 4.0, 0.5), "fc2.weight": t(4.0)}, 100)})
    new = m.aggregate_train(server, uploads, sctx)
    # group 0 becomes W_new + update = the trained model of its only participant
    assert torch.allclose(new["group_models"][0]["fc1.weight"], t(5.5, 0.5))
    assert torch.allclose(new["group_models"][1]["fc1.weight"], t(0.0, 2.0))  # untouched


def test_group_step_with_federation_gammas():
    """step_weights = "federation": line 10 with gamma_k = n_k / (all K clients' data), as in line 11."""
    m = build_method("fedalp", {"t_pre": 2, "step_weights": "federation"})
    server = _hier_server()
    sctx = _sctx()  # 800 samples in the federation
    uploads = _three_uploads()
    new = m.aggregate_train(server, uploads, sctx)
    # group 0: w_0 + 100/800 * (4, 0 | 0) + 300/800 * (0, 0 | 8) = (2.5, 0 | 7)
    assert torch.allclose(new["group_models"][0]["fc1.weight"], t(2.5, 0.0))
    assert torch.allclose(new["group_models"][0]["fc2.weight"], t(7.0))
    # group 1: w_1 + 200/800 * (0, 3 | 0)
    assert torch.allclose(new["group_models"][1]["fc1.weight"], t(0.0, 2.75))
    assert torch.allclose(new["global"]["fc2.weight"], t(2.5))  # (7 + -2) / 2


def test_global_from_groups_weights():
    g = global_from_groups([{"w": t(0.0)}, {"w": t(10.0)}, {"w": t(99.0)}], [1.0, 3.0, 0.0])
    assert torch.allclose(g["w"], t(7.5))


def test_unclustered_client_joins_nearest_group():
    m = build_method("fedalp", {"t_pre": 2})
    server = _hier_server()
    server["groups"] = [0, 0, 1, -1]  # client 3 was never sampled before T_pre
    server["last_update"] = {0: t(1.0, 0.0, 0.0), 1: t(2.0, 0.0, 0.0), 2: t(0.0, 1.0, 1.0)}
    sctx = _sctx()
    assert torch.equal(m.configure_train(server, 3, sctx).params()["fc1.weight"], server["global"]["fc1.weight"])
    up = _replies({3: ({"fc1.weight": t(1.0, 1.5), "fc2.weight": t(1.5)}, 200)})  # dw = (0, .5, .5)
    new = m.aggregate_train(server, up, sctx)
    assert new["groups"][3] == 1


# ------------------------------------------------------------------------------------------------ Alg. 2 clustering
def test_ward_linkage_hand_computed():
    # points on a line at 0, 1, 5: merge {0,1} at 1, then {0,1}+{5} at sqrt(2*2*1/3) * |0.5 - 5| = sqrt(27)
    x = np.array([0.0, 1.0, 5.0])
    z = ward_linkage(np.abs(x[:, None] - x[None, :]))
    assert z[0].tolist() == [0.0, 1.0, 1.0, 2.0]
    assert z[1, :2].tolist() == [2.0, 3.0] and z[1, 3] == 3.0
    assert z[1, 2] == pytest.approx(math.sqrt(27.0))
    assert cut(z, 2).tolist() == [0, 0, 1]
    assert cut(z, 3).tolist() == [0, 1, 2]
    assert sorted(leaf_order(z).tolist()) == [0, 1, 2]


def test_ward_recovers_constructed_groups():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(3, 40))
    truth = np.array([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2])
    updates = base[truth] + 0.3 * rng.normal(size=(len(truth), 40))
    rho = cosine_similarity(updates)
    assert np.allclose(np.diag(rho), 1.0) and np.allclose(rho, rho.T)
    for kind in ("cosine", "angular"):
        labels, z = ward_groups(similarity_to_distance(rho, kind), 3)
        assert adjusted_rand_index(labels, truth) == pytest.approx(1.0)
        assert labels[0] == 0  # groups numbered by their smallest member
    labels2, _ = ward_groups(similarity_to_distance(rho), 2)
    assert len(set(labels2.tolist())) == 2


def test_ward_matches_scipy():
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    distance = pytest.importorskip("scipy.spatial.distance")
    rng = np.random.default_rng(0)
    d = similarity_to_distance(cosine_similarity(rng.normal(size=(25, 6))), "angular")
    z = ward_linkage(d)
    zs = hierarchy.linkage(distance.squareform(d, checks=False), "ward")
    assert np.allclose(z, zs)
    assert adjusted_rand_index(cut(z, 4), hierarchy.fcluster(zs, 4, "maxclust")) == pytest.approx(1.0)


def test_adjusted_rand_index_hand_values():
    assert adjusted_rand_index([0, 0, 1, 1], [5, 5, 3, 3]) == pytest.approx(1.0)
    # contingency [[2, 0, 0], [0, 1, 1]]: index 1, expected 2 * 1 / 6, max 1.5 -> (2/3) / (7/6) = 4/7
    assert adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(4 / 7)
    assert adjusted_rand_index([0, 1, 0, 1], [0, 0, 1, 1]) == pytest.approx(-0.5)


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture
def one_class_fed():
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.synthetic import make_synthetic

    spec = PartitionSpec(kind="one_class", num_clients=8, samples_per_client=25, split="official",
                         test_per_client=10)
    return build_federated(make_synthetic(), spec, seed=0)


def test_clustering_recovers_one_class_groups(one_class_fed):
    sim = tiny_sim(one_class_fed, "fedalp", {"t_pre": 2, "num_groups": 4, "beta": 0.6}, rounds=3)
    sim.run()
    server = sim.server
    assert len(server["clusterings"]) == 1 and server["clusterings"][0]["round"] == 2
    rep = clustering_report(server["clusterings"][0], one_class_fed.counts["train"])
    assert rep["dominant_class"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rep["ari_vs_dominant_class"] == pytest.approx(1.0)
    assert sorted(rep["group_sizes"]) == [2, 2, 2, 2]
    for psi in server["psi"]:  # max layer gets exactly beta
        assert max(psi.values()) == pytest.approx(0.6) and min(psi.values()) >= 0.0
    last = sim.history[-1]
    assert last["acc"] != last["global_acc"]  # personalized and global models both reported


def test_beta_zero_is_fedavg(tiny_fed):
    kw = dict(rounds=4, seed=3)
    alp = tiny_sim(tiny_fed, "fedalp", {"beta": 0.0, "t_pre": 1, "num_groups": 2}, **kw)
    avg = tiny_sim(tiny_fed, "fedavg", **kw)
    ha, hf = alp.run(), avg.run()
    assert alp.server["groups"] is not None  # clustering did happen (after round 1)
    for ra, rf in zip(ha, hf):
        assert ra["global_acc"] == pytest.approx(rf["acc"], abs=1e-12)
        assert ra["acc"] == pytest.approx(rf["acc"], abs=1e-12)  # W_new = w_g when Psi = 0
        assert ra["train_loss"] == pytest.approx(rf["train_loss"], rel=1e-5)
    assert torch.allclose(flatten(alp.server["global"]), flatten(avg.server["global"]), atol=1e-5)


def test_beta_zero_is_fedavg_under_partial_participation(tiny_fed):
    """With half the clients per round, beta = 0 equals FedAvg exactly when line 11 weights the round's
    participants and group models restart from W_new (= w_g); with all members' data it does not."""
    kw = dict(rounds=5, seed=4, join_ratio=0.5)
    opts = {"beta": 0.0, "t_pre": 1, "num_groups": 2, "group_update": "mixed_start", "global_weights": "participants"}
    alp = tiny_sim(tiny_fed, "fedalp", opts, **kw)
    avg = tiny_sim(tiny_fed, "fedavg", **kw)
    ha, hf = alp.run(), avg.run()
    assert [r["global_acc"] for r in ha] == pytest.approx([r["acc"] for r in hf], abs=1e-12)
    assert torch.allclose(flatten(alp.server["global"]), flatten(avg.server["global"]), atol=1e-5)
    members = tiny_sim(tiny_fed, "fedalp", {**opts, "global_weights": "members"}, **kw)
    members.run()
    assert not torch.allclose(flatten(members.server["global"]), flatten(avg.server["global"]), atol=1e-5)


def test_end_to_end_deterministic_and_resumable(one_class_fed, tmp_path):
    opts = {"t_pre": 1, "num_groups": 3, "recluster_every": 2}
    a = tiny_sim(one_class_fed, "fedalp", opts, rounds=4, seed=7)
    b = tiny_sim(one_class_fed, "fedalp", opts, rounds=4, seed=7)
    ha, hb = a.run(), b.run()
    assert [m["acc"] for m in ha] == [m["acc"] for m in hb]
    assert [m["global_acc"] for m in ha] == [m["global_acc"] for m in hb]
    assert torch.equal(flatten(a.server["global"]), flatten(b.server["global"]))
    assert len(a.server["clusterings"]) == 2  # once at T_pre = 1, again at round 3
    c = tiny_sim(one_class_fed, "fedalp", opts, rounds=4, seed=7)
    c.run_round()
    c.run_round()
    c.save(tmp_path / "ck.pt")
    d = tiny_sim(one_class_fed, "fedalp", opts, rounds=4, seed=7)
    d.restore(tmp_path / "ck.pt")
    hd = d.run()
    assert [m["acc"] for m in hd] == [m["acc"] for m in ha]
    assert torch.equal(flatten(d.server["global"]), flatten(a.server["global"]))


def test_partial_participation_runs(one_class_fed):
    sim = tiny_sim(one_class_fed, "fedalp", {"t_pre": 2, "num_groups": 4}, rounds=4, join_ratio=0.5)
    sim.run()
    groups = sim.server["groups"]
    assert len(groups) == 8 and max(groups) <= 3
    assert all("global_acc" in m for m in sim.history)


def test_options_validated():
    with pytest.raises(ConfigError, match="beta"):
        build_method("fedalp", {"beta": 1.5})
    with pytest.raises(ConfigError, match="similarity"):
        build_method("fedalp", {"similarity": "euclid"})
    m = build_method("fedalp", {"t_pre_fraction": 0.4})
    assert m.t_pre(_sctx(2, rounds=50).run) == 20
    assert build_method("fedalp", {"t_pre": 7}).t_pre(_sctx(2, rounds=50).run) == 7
