"""pFedRLLA: Alg. 2 body / head aggregation, Eq. 1-2, the DDPG agent, embeddings, agent files, resume, ablation
switches; plus the engine's before / after-training scores and rounds_to_target (used by pFedRLLA's tables)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

from fedblend.algorithms.pfedrlla import (
    PFedRLLAOptions,
    ddpg,
    embedding,
    load_agent,
    reward,
    reward_terms,
    save_agent,
    similarity_target,
)
from fedblend.algorithms.registry import build_method
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.message import Message
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from tests.helpers import run_client, same_state, tiny_sim, without_timings

# the agent acts and learns from round 1 on (the defaults wait 50 rounds), auto-encoder every round
ACTIVE = {"random_rounds": 1, "update_every": 1, "updates": 2, "batch": 4, "emb_dim": 16, "factor": 8,
          "hidden": 32}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def upload_round(sim):
    """Run round ``sim.next_round``'s upload exchange by hand; return (server after it, server ctx, replies)."""
    sctx = sim.sctx(sim.next_round)
    cids = list(range(sim.fed.num_clients))
    replies = {c: run_client(sim, c, Message(), phase="upload").reply for c in cids}
    return sim.method.aggregate("upload", sim.server, replies, sctx), sctx, replies


def hand_average(models, weights, name):
    total = sum(weights)
    return sum(float(w) / total * m[name].double() for m, w in zip(models, weights))


# ------------------------------------------------------------------------------------------ Alg. 2
@pytest.mark.parametrize("opts", [{}, {"head_weights": "mean"}])
def test_body_is_data_size_average_over_previous_and_own(tiny_fed, opts):
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, **opts}, rounds=3, seed=0, join_ratio=0.5)
    sim.run_round()
    prev = sim.server["store"]
    server, sctx, replies = upload_round(sim)
    assert server["round"]["prev_cids"] == prev["cids"] and len(prev["cids"]) == 2
    sizes = {c: tiny_fed.clients[c].num_train for c in range(4)}
    assert prev["sizes"] == [float(sizes[c]) for c in prev["cids"]]
    body = sim.model.body_names()[:1]  # mlp: fc1 is the body under the "fc" rule (fc2 is the head)
    head = ["fc2.weight", "fc2.bias"]
    for k in range(4):
        msg = sim.method.configure("train", server, k, sctx)
        models = list(prev["params"]) + [replies[k].params()]
        w = [sizes[c] for c in prev["cids"]] + [sizes[k]]
        for n in sim.model.param_names(["fc1"]):
            assert torch.allclose(msg.params()[n].double(), hand_average(models, w, n), atol=1e-6), (k, n)
        assert body == ["fc1.weight"]
        if opts:  # plain mean of the heads (ablation "Body")
            for n in head:
                assert torch.allclose(msg.params()[n].double(), hand_average(models, [1, 1, 1], n), atol=1e-6)


@pytest.mark.parametrize("storage", ["uploads", "aggregated", "trained"])
def test_previous_participants_models_are_what_the_storage_option_names(tiny_fed, storage):
    """``K'`` holds the round's uploads, the personalized models the server sent (Alg. 1 line 6 as an
    assignment), or the participants' models after their training -- each exactly; only "trained" replies carry
    a model."""
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "storage": storage}, rounds=3, seed=0, join_ratio=0.5)
    sim.run_round()  # round 1: K' = K; the agent acts from round 2
    seen = {"upload": {}, "sent": {}, "reply": {}}
    configure, aggregate = sim.method.configure, sim.method.aggregate

    def spy_configure(phase, server, cid, sctx):
        msg = configure(phase, server, cid, sctx)
        if phase == "train":
            seen["sent"][cid] = {n: t.clone() for n, t in msg.params().items()}
        return msg

    def spy_aggregate(phase, server, replies, sctx):
        seen["upload" if phase == "upload" else "reply"].update(replies)
        return aggregate(phase, server, replies, sctx)

    sim.method.configure, sim.method.aggregate = spy_configure, spy_aggregate
    sim.run_round()
    store = sim.server["store"]
    assert store["cids"] == sorted(seen["sent"]) and len(store["cids"]) == 2
    assert all(bool(r.arrays) == (storage == "trained") for r in seen["reply"].values())
    for c, kept in zip(store["cids"], store["params"]):
        candidates = {"uploads": seen["upload"][c].params(), "aggregated": seen["sent"][c],
                      "trained": sim.store.get(c)["params"]}  # the last: the client's model after its training
        same = {k: set(m) == set(kept) and all(torch.equal(kept[n], m[n]) for n in kept)
                for k, m in candidates.items()}
        assert same == {k: k == storage for k in candidates}, (storage, c, same)  # the three differ on this run



@pytest.mark.parametrize("storage", ["uploads", "aggregated"])
def test_server_aggregation_seconds_count_every_personalized_model_built(tiny_fed, storage):
    """App. E's cost split: ``server_aggregation_seconds`` holds the time of every Alg. 2 mixture of the round,
    the ones sent and, with ``storage = "aggregated"``, the ones recomputed for ``K'``."""
    import time

    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "storage": storage}, rounds=2, seed=0, join_ratio=0.5)
    sim.run_round()
    built, real = [], sim.method.personalized

    def slow(rnd, i, sctx):  # each mixture takes at least 50 ms
        built.append(i)
        time.sleep(0.05)
        return real(rnd, i, sctx)

    sim.method.personalized = slow
    sim.run_round()
    assert len(built) == (4 if storage == "aggregated" else 2)  # 2 participants; again for K' when "aggregated"
    assert sim.history[-1]["server_aggregation_seconds"] >= 0.05 * len(built)

def test_head_weights_sum_to_one_and_index_the_right_clients(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedrlla", ACTIVE, rounds=3, seed=1, join_ratio=0.5)
    sim.run_round()
    server, sctx, replies = upload_round(sim)
    rnd = server["round"]
    assert rnd["actions"].shape == (4, 3)  # every client of this round, over [K'..., k]
    assert torch.allclose(rnd["actions"].sum(1), torch.ones(4)) and bool((rnd["actions"] >= 0).all())
    models = list(server["store"]["params"]) + [None]
    for pos in range(3):  # put all head weight on one position: the head must be exactly that model's head
        one_hot = torch.zeros(4, 3)
        one_hot[:, pos] = 1.0
        srv = {**server, "round": {**rnd, "actions": one_hot}}
        for k in range(4):
            msg = sim.method.configure("train", srv, k, sctx)
            src = models[pos] if pos < 2 else replies[k].params()
            for n in ("fc2.weight", "fc2.bias"):
                assert torch.equal(msg.params()[n], src[n]), (pos, k, n)
    # and the agent's own weights are applied as given
    k = 3
    msg = sim.method.configure("train", server, k, sctx)
    expect = hand_average(list(server["store"]["params"]) + [replies[k].params()], rnd["actions"][k].tolist(),
                          "fc2.weight")
    assert torch.allclose(msg.params()["fc2.weight"].double(), expect, atol=1e-6)


def test_head_weights_uniform_under_mean_switch_and_agent_off(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "head_weights": "mean"}, rounds=2, seed=2)
    sim.run()
    assert sim.server["agent"] is None and sim.server["embed"] is None
    for m in sim.history:
        for _, w in m["head_weights"]:
            assert w == [0.2] * 5  # |K'| = 4 plus k itself


def test_agent_on_whole_network_applies_action_to_body(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "agent_scope": "all", "head_weights": "mean"}, rounds=3,
                   seed=3, join_ratio=0.5)
    sim.run_round()
    server, sctx, replies = upload_round(sim)
    a = server["round"]["actions"]
    for k in range(4):
        msg = sim.method.configure("train", server, k, sctx)
        models = list(server["store"]["params"]) + [replies[k].params()]
        for n in ("fc1.weight", "fc2.weight"):
            assert torch.allclose(msg.params()[n].double(), hand_average(models, a[k].tolist(), n), atol=1e-6)


# ------------------------------------------------------------------------------------------ Eq. 1-2
def test_similarity_target_is_eq2():
    e_prev = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0]])
    v = similarity_target(e_prev, torch.tensor([2.0, 0.0]))
    # cos = 1, 0, -1 -> d = 1, 0.5, 0; self 1; sum 2.5
    assert torch.allclose(v, torch.tensor([1.0, 0.5, 0.0, 1.0]) / 2.5)


def test_reward_terms_by_hand():
    a, v = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    r1, r2, r3 = reward_terms(0.8, 0.6, a, v, acc_tar=1.0)
    assert r1 == pytest.approx(math.exp(-0.2) - 1) and r2 == pytest.approx(0.2) and r3 == pytest.approx(-0.5)
    assert reward_terms(0.8, 0.6, a, v, 1.0, "plain")[2] == pytest.approx(-math.sqrt(0.5))
    assert reward_terms(0.9, 0.6, a, v, acc_tar=0.9)[0] == pytest.approx(0.0)
    assert reward((r1, r2, r3), (1, 1, 2)) == pytest.approx(r1 + r2 - 1.0)
    assert reward((r1, r2, r3), (0, 1, 2)) == pytest.approx(r2 - 1.0)


def test_round_rewards_match_the_clients_scores(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedrlla", ACTIVE, rounds=2, seed=4)
    sim.run_round()
    server, sctx, replies = upload_round(sim)
    rnd = server["round"]
    train_replies = {}
    for k in range(4):
        sim.store.put(k, run_client(sim, k, Message(), phase="upload").state)
        train_replies[k] = run_client(sim, k, sim.method.configure("train", server, k, sctx)).reply
    sim.method.aggregate("train", server, train_replies, sctx)
    expect = []
    for i, k in enumerate(rnd["cids"]):
        acc_agg, acc_pre = train_replies[k].metrics["acc_agg"], replies[k].metrics["acc_pre"]
        dist2 = float(((rnd["actions"][i] - rnd["targets"][i]) ** 2).sum())
        expect.append((math.exp(acc_agg - 1.0) - 1) + (acc_agg - acc_pre) - 2 * dist2)
    assert sctx.stats["rewards"] == pytest.approx(expect, abs=1e-6)


# ------------------------------------------------------------------------------------------ the agent
def test_agent_update_moves_actor_toward_higher_critic_value():
    cfg = PFedRLLAOptions(hidden=32, batch=32, actor_lr=3e-3, critic_lr=3e-3)
    g = torch.Generator().manual_seed(0)
    agent = ddpg.init_agent(4, 3, g, cfg)
    obs = torch.randn(64, 4, generator=g)
    act = torch.stack([ddpg.random_action(3, g) for _ in range(64)])
    agent = ddpg.store(agent, obs, act, act[:, 0] - act[:, 2], capacity=1000)  # reward: weight on 0, not on 2
    probe = obs[:8]
    before = ddpg.policy(agent["actor"], probe)
    for i in range(300):
        agent, info = ddpg.update(agent, torch.Generator().manual_seed(i), cfg)
    after = ddpg.policy(agent["actor"], probe)
    q_before = ddpg.q_value(agent["critic"], probe, before).mean()
    q_after = ddpg.q_value(agent["critic"], probe, after).mean()
    assert float(q_after) > float(q_before) + 0.05
    assert float(after[:, 0].mean()) > float(before[:, 0].mean()) + 0.1
    assert float(after[:, 2].mean()) < float(before[:, 2].mean())
    assert agent["updates"] == 300 and not same_state(agent["actor_target"], agent["actor"])


def test_policy_diagnostics_tell_a_constant_saturated_policy_on_uninformative_states_from_a_state_driven_one():
    """``scripts/pfedrlla_plots.py``'s probe of a run's agent (issue #25: does the agent's output depend on its
    state?). States whose three embeddings are one vector (the common part only) leave Eq. 2's V uniform and no
    spread; an actor whose output bias is huge is saturated and gives every state the same weights. Distinct
    embeddings and a fresh actor scaled up give V off uniform and weights that move with the state."""
    from tests.helpers import load_script

    plots = load_script("pfedrlla_plots")
    g = torch.Generator().manual_seed(0)
    agent = ddpg.init_agent(3 * 4, 3, g, PFedRLLAOptions(hidden=8))
    same = torch.randn(50, 1, 4, generator=g).expand(50, 3, 4).reshape(50, 12)
    saturated = {**agent["actor"], "l2.bias": torch.tensor([50.0, -50.0, 50.0])}
    flat = plots.policy_diagnostics({**agent, "actor": saturated, "buffer": {**agent["buffer"], "obs": same}})
    assert flat["spread"] == pytest.approx(0.0, abs=1e-6) and flat["cos_min"] == pytest.approx(1.0, abs=1e-6)
    assert flat["target_max_dev"] == pytest.approx(0.0, abs=1e-6)
    assert flat["saturated"] == 1.0 and flat["weight_std"] == pytest.approx(0.0, abs=1e-9)
    e = math.e
    assert flat["weight_mean"] == pytest.approx([e / (2 * e + 1 / e), (1 / e) / (2 * e + 1 / e), e / (2 * e + 1 / e)])
    varied = torch.randn(50, 12, generator=g)
    scaled = {k: v * 3 for k, v in agent["actor"].items()}
    live = plots.policy_diagnostics({**agent, "actor": scaled, "buffer": {**agent["buffer"], "obs": varied}})
    assert live["spread"] > 0.5 and live["cos_min"] < 0.5 and live["target_max_dev"] > 0.05
    assert live["saturated"] < 1.0 and live["weight_std"] > 0.01
    assert plots.policy_diagnostics(agent) == {}  # an empty replay buffer


def test_critic_slot_gradient_is_the_centred_action_gradient_of_a_linear_critic():
    """``scripts/pfedrlla_plots.py``: with a critic ``Q(s, a) = c . a`` (first layer picks the action, ReLU passes
    the non-negative weights, second layer identity, last layer ``c``) the push on each slot is ``c - mean(c)``
    whatever the state and the actor: the slot with the largest ``c`` is the one the critic asks more weight for."""
    from tests.helpers import load_script

    plots = load_script("pfedrlla_plots")
    obs_dim, k = 6, 4
    agent = ddpg.init_agent(obs_dim, k, torch.Generator().manual_seed(1), PFedRLLAOptions(hidden=k))
    c = torch.tensor([0.5, -1.0, 2.0, 0.1])
    critic = {"l0.weight": torch.cat([torch.zeros(k, obs_dim), torch.eye(k)], 1), "l0.bias": torch.zeros(k),
              "l1.weight": torch.eye(k), "l1.bias": torch.zeros(k), "l2.weight": c[None], "l2.bias": torch.zeros(1)}
    obs = torch.randn(20, obs_dim, generator=torch.Generator().manual_seed(2))
    grad = plots.critic_slot_gradient({**agent, "critic": critic}, obs)
    assert grad == pytest.approx((c - c.mean()).tolist(), abs=1e-6)
    assert plots.top_slots(grad, 2) == [0, 2]


def test_initial_agent_is_the_agent_a_run_with_that_seed_draws(tiny_fed):
    """The probe's ``initial_agent(agent, seed)`` equals the agent the run creates in round 0 (before any DDPG
    update: ``random_rounds`` keeps round 1 free of updates), and another seed draws another one."""
    from tests.helpers import load_script

    plots = load_script("pfedrlla_plots")
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "random_rounds": 5}, rounds=1, seed=7)
    sim.run_round()
    agent = sim.server["agent"]
    assert int(agent["updates"]) == 0
    again = plots.initial_agent(agent, 7)
    assert same_state(again["actor"], agent["actor"]) and same_state(again["critic"], agent["critic"])
    assert not same_state(plots.initial_agent(agent, 8)["critic"], agent["critic"])


def test_replaying_a_runs_updates_from_its_own_seed_gives_its_agent_and_another_seed_another(tiny_fed):
    """``replay_updates``: the run's DDPG updates again on its stored experience. From the run's seed it is the
    run's agent bit for bit (one thread here, as in the run); from another seed, another agent (only the initial
    networks differ); a buffer that is not a whole number of rows per round is refused."""
    from tests.helpers import load_script

    plots = load_script("pfedrlla_plots")
    sim = tiny_sim(tiny_fed, "pfedrlla", ACTIVE, rounds=3, seed=5)
    for _ in range(3):
        sim.run_round()
    agent = sim.server["agent"]
    assert int(agent["updates"]) == 3 * ACTIVE["updates"]
    again = plots.replay_updates(agent, sim.method.opts, 5, 3, 5)
    assert same_state(again["actor"], agent["actor"]) and same_state(again["critic"], agent["critic"])
    other = plots.replay_updates(agent, sim.method.opts, 5, 3, 6)
    assert int(other["updates"]) == int(agent["updates"]) and not same_state(other["actor"], agent["actor"])
    with pytest.raises(ValueError, match="whole number"):
        plots.replay_updates(agent, sim.method.opts, 5, 5, 5)


def test_head_weight_matrix_adds_the_own_upload_to_the_clients_stored_model_and_leaves_absent_clients_out(tmp_path):
    """``scripts/pfedrlla_plots.py``'s Fig. 3 matrix: row k holds client k's weights over ``K'`` then its own
    upload; its own column sums the two when k is in ``K'``; clients outside ``K'`` are NaN. The heatmap of a
    few clients names each one's classes on its axes."""
    import numpy as np

    from tests.helpers import load_script

    plots = load_script("pfedrlla_plots")
    entry = {"round": 7, "head_prev_cids": [0, 2], "head_weights": [[0, [0.5, 0.2, 0.3]], [1, [0.1, 0.6, 0.3]]]}
    mat = plots.head_weight_matrix(entry, 3)
    assert mat[0, 0] == pytest.approx(0.8) and mat[0, 2] == 0.2 and np.isnan(mat[0, 1])  # 0.5 stored + 0.3 own
    assert mat[1].tolist() == pytest.approx([0.1, 0.3, 0.6])  # client 1 was not in K': its own column holds its upload only
    assert np.isnan(mat[2]).all()  # client 2 did not aggregate this round
    plots.head_heatmap([entry], [frozenset({0, 1}), frozenset({1, 2}), frozenset({3})], tmp_path)
    assert (tmp_path / "pfedrlla_head_weights.png").stat().st_size > 1000


def test_replay_buffer_is_a_ring():
    agent = ddpg.init_agent(2, 2, torch.Generator().manual_seed(0), PFedRLLAOptions(hidden=4))
    for i in range(5):
        agent = ddpg.store(agent, torch.full((1, 2), float(i)), torch.ones(1, 2) / 2, torch.tensor([float(i)]), 3)
    assert agent["buffer"]["rew"].tolist() == [3.0, 4.0, 2.0] and agent["buffer"]["next"] == 2


@pytest.mark.parametrize("kind", ["mhae", "flat"])
def test_autoencoder_training_lowers_reconstruction_error(kind):
    g = torch.Generator().manual_seed(0)
    cfg = embedding.EmbedConfig(kind=kind, dim=16, factor=8)
    emb = embedding.init_embedder([(10, 33), (5, 11)], g, cfg)
    mats = [[torch.randn(10, 33, generator=g), torch.randn(5, 11, generator=g)] for _ in range(6)]
    x = embedding.project(emb, mats)
    before = float(embedding.reconstruction_loss(emb, x))
    trained, _ = embedding.train(emb, x, 30, 5e-3)
    assert float(embedding.reconstruction_loss(trained, x)) < 0.9 * before
    e = embedding.embed(trained, mats + [mats[0]])
    assert e.shape == (7, 16) and torch.equal(e[0], e[-1]) and not torch.equal(e[0], e[1])


def test_pca_embedding_separates_groups():
    g = torch.Generator().manual_seed(0)
    centres = [torch.randn(1, 40, generator=g) * 3 for _ in range(2)]
    mats = [[centres[i % 2] + 0.1 * torch.randn(1, 40, generator=g)] for i in range(8)]
    e = embedding.embed({"kind": "pca", "dim": 4}, mats)
    first = e[:, 0]
    assert e.shape == (8, 4) and bool((torch.sign(first[0::2]) == torch.sign(first[0])).all())
    assert bool((torch.sign(first[1::2]) == -torch.sign(first[0])).all())


# ------------------------------------------------------------------------------------------ files, resume
def test_pretrained_agent_file_round_trips_and_mismatch_fails(tiny_fed, tmp_path):
    sim = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "body": "local"}, rounds=2, seed=5, join_ratio=0.5)
    sim.run()
    path = save_agent(sim.server, tmp_path / "agent.pt")
    data = load_agent(path)
    assert same_state(data["agent"], sim.server["agent"]) and same_state(data["embed"], sim.server["embed"])
    used = tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "agent": str(path)}, rounds=2, seed=6, join_ratio=0.5)
    assert used.server["pretrained"] and same_state(used.server["agent"], sim.server["agent"])
    used.run()  # fine-tunes: every round with update_every = 1 and finetune_updates = 1
    assert used.server["agent"]["updates"] == sim.server["agent"]["updates"] + 2
    with pytest.raises(ValueError, match="previous participants"):  # K differs: 4 joining instead of 2
        tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "agent": str(path)}, rounds=2, seed=6).run()
    with pytest.raises(ValueError, match="head layer"):  # embedding factor differs
        tiny_sim(tiny_fed, "pfedrlla", {**ACTIVE, "factor": 4, "agent": str(path)}, rounds=2, seed=6)
    with pytest.raises(FileNotFoundError, match="fedblend pretrain"):
        tiny_sim(tiny_fed, "pfedrlla", {"agent": str(tmp_path / "missing.pt")})


@pytest.mark.parametrize("opts", [ACTIVE, {**ACTIVE, "embedding": "pca", "storage": "uploads", "r3_norm": "plain"}])
def test_resume_equals_uninterrupted_with_agent_learning(tiny_fed, tmp_path, opts):
    sim = tiny_sim(tiny_fed, "pfedrlla", opts, rounds=4, seed=7, join_ratio=0.5)
    sim.run_round(), sim.run_round()
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, "pfedrlla", opts, rounds=4, seed=7, join_ratio=0.5)
    twin.restore(tmp_path / "ck.pt")
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)
    assert same_state(sim.server, twin.server) and sim.server["agent"]["updates"] == 8  # 2 per round from round 1
    assert all("server_embedding_seconds" in m and "reward" in m for m in sim.history)


def test_no_global_model_and_client_evaluates_its_own_model(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedrlla", ACTIVE, rounds=1, seed=8)
    sim.run()
    assert "global_acc" not in sim.history[-1] and sim.method.configure_evaluate(sim.server, 0, sim.sctx(0)).arrays == {}
    assert all(sim.store.get(c)["trained"] for c in range(4))


# ------------------------------------------------------------------------------------------ engine additions
def test_before_after_scores_and_rounds_to_target(tiny_fed):
    from fedblend.config import RunConfig
    from fedblend.experiment import summarize

    method = build_method("fedavg")
    proto = EvalProtocol(before_after=True, target=0.0)
    sim = Simulation.create(method, tiny_fed, "mlp", TrainConfig(lr=0.05, batch_size=16), 3, 0,
                            SamplingConfig(join_ratio=1.0), proto)
    sim.run()
    # FedAvg's BP model in round t+1 is the global model evaluated after round t, on the same (test) split
    assert sim.history[1]["bp_acc"] == pytest.approx(sim.history[0]["acc"])
    assert sim.history[2]["bp_acc"] == pytest.approx(sim.history[1]["acc"])
    assert all(0 <= m["ap_acc"] <= 1 and "bp_correct" not in m for m in sim.history)
    s = summarize(RunConfig(method="fedavg", eval=proto), sim, 1.0)
    assert s["rounds_to_target"] == 1 and "ap_final_accuracy" in s
    sim.protocol = EvalProtocol(target=1.01)
    assert summarize(RunConfig(), sim, 1.0)["rounds_to_target"] is None


def test_cli_pretrain_then_run_with_the_agent(tmp_path, capsys):
    from fedblend.cli.main import main

    base = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=4",
            "--set", "partition.min_samples=5", "--set", "train.lr=0.05", "--set", "method=pfedrlla", "--quiet",
            "--set", "sampling.join_ratio=0.5", "--set", "options.emb_dim=16", "--set", "options.factor=8",
            "--set", "options.hidden=32", "--set", "options.random_rounds=1", "--set", "options.update_every=1"]
    agent = tmp_path / "agent.pt"
    assert main(["pretrain", *base, "--out", str(agent)]) == 0
    data = load_agent(agent)
    assert data["agent"]["updates"] == 10  # rounds 1-2, 5 updates each (notes' schedule)
    assert "body = \"local\"" in (tmp_path / "agent.pt.run" / "config.toml").read_text()
    assert main(["run", *base, "--set", f"options.agent={str(agent)!r}", "--out", str(tmp_path / "run")]) == 0
    inputs = json.loads((tmp_path / "run" / "summary.json").read_text())["run"]["inputs"]
    assert inputs == {"options.agent": {"path": str(agent), "sha256": hashlib.sha256(agent.read_bytes()).hexdigest()}}
    assert main(["pretrain", "--set", "dataset=synthetic", "--out", str(agent)]) == 2
    assert "method = 'pfedrlla'" in capsys.readouterr().err


def test_cli_pretrain_interrupted_resumes_with_the_command_it_names_to_the_same_agent(tmp_path, capsys, monkeypatch):
    """A pre-training run that spans sessions: Ctrl-C after round 3 (last checkpoint: round 2) names
    ``fedblend pretrain ... --resume``
    (not ``fedblend run``, which would finish the run without writing the agent file), and that command writes
    the agent an uninterrupted pre-training writes."""
    import fedblend.progress
    from fedblend.algorithms.pfedrlla import load_agent
    from fedblend.cli.main import main

    base = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=4", "--set", "partition.num_clients=4",
            "--set", "partition.min_samples=5", "--set", "train.lr=0.05", "--set", "method=pfedrlla",
            "--set", "sampling.join_ratio=0.5", "--set", "options.emb_dim=16", "--set", "options.factor=8",
            "--set", "options.hidden=32", "--set", "options.random_rounds=1", "--set", "options.update_every=1",
            "--set", "checkpoint_every=2"]
    whole = tmp_path / "whole.pt"
    assert main(["pretrain", *base, "--quiet", "--out", str(whole)]) == 0

    def ctrl_c(m, sim):
        if m["round"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(fedblend.progress, "Progress", lambda total, label: ctrl_c)
    agent = tmp_path / "agent.pt"
    assert main(["pretrain", *base, "--out", str(agent)]) == 130
    monkeypatch.undo()
    run_dir = tmp_path / "agent.pt.run"
    again = f"fedblend pretrain {run_dir / 'config.toml'} --out {agent}"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedblend: error: interrupted after round 3; resume with: {again} --resume (continues from the "
                   f"checkpoint of round 2)"]
    assert not agent.exists()
    assert main([*again.split()[1:], "--resume", "--quiet"]) == 0
    resumed, uninterrupted = load_agent(agent), load_agent(whole)
    assert resumed["agent"]["updates"] == uninterrupted["agent"]["updates"] == 20  # rounds 1-4, 5 updates each
    assert same_state(resumed["agent"], uninterrupted["agent"]) and same_state(resumed["embed"], uninterrupted["embed"])
    assert main([*again.split()[1:], "--resume", "--force", "--quiet"]) == 2


def test_adam_step_equals_torch_optim_adam():
    """The functional Adam (kept as data in the server state) makes torch.optim.Adam's updates."""
    from fedblend.core.optim import adam_init, minimise

    g = torch.Generator().manual_seed(0)
    net = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    x = torch.randn(8, 4, generator=g)

    def loss_fn(p):
        return ((x @ p["w"] + p["b"]) ** 2).mean()

    ref = {k: v.clone().requires_grad_(True) for k, v in net.items()}
    opt_ref = torch.optim.Adam(list(ref.values()), lr=0.01)
    ours, opt = dict(net), adam_init(net)
    for _ in range(5):
        ours, opt, _ = minimise(ours, opt, 0.01, loss_fn)
        opt_ref.zero_grad()
        loss_fn(ref).backward()
        opt_ref.step()
    assert all(torch.allclose(ours[k], ref[k].detach(), atol=1e-6) for k in net) and opt["t"] == 5
    assert not torch.allclose(ours["w"], net["w"])  # it moved
