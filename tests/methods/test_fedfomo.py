"""FedFomo: the first-order model weights and update (Eq. 5-7) by hand, model selection, what travels."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.fedfomo import fomo_update, fomo_weights, select_models
from tests.helpers import run_client, same_state, tiny_sim, train_message

pytestmark = pytest.mark.usefixtures("one_thread")


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


# ------------------------------------------------------------------------------------------------ the hold-out
# Eq. 6-7: L_i is client i's loss on its own validation data, which it does not train on; the authors' code
# holds out a seeded random 20 % of the local data, PFLlib the last 20 % of the training split (val_ratio 0.2).


def _poison_rows(fed, rows_of):
    """``fed`` with the training rows ``rows_of(cid, n)`` of every client replaced by noise (labels kept)."""
    from dataclasses import replace

    clients = []
    for cid, c in enumerate(fed.clients):
        x = c.train_x.clone()
        rows = rows_of(cid, c.num_train)
        x[rows] = torch.randn(x[rows].shape, generator=torch.Generator().manual_seed(cid)) * 5
        clients.append(replace(c, train_x=x))
    return replace(fed, clients=clients)


def _last_rows(fraction):
    return lambda cid, n: torch.arange(n - int(fraction * n), n)


def test_holdout_rows_hold_out_the_floor_share_disjoint_and_covering():
    from fedblend.algorithms.fedfomo import holdout_rows

    for pick in ("random", "last"):
        keep, held = holdout_rows(78, 0.2, pick, torch.Generator().manual_seed(3))
        assert len(held) == 15 and len(keep) == 63  # PFLlib: int(0.2 * 78) = 15 held out
        assert sorted(keep.tolist() + held.tolist()) == list(range(78))
    assert holdout_rows(78, 0.2, "last", torch.Generator())[1].tolist() == list(range(63, 78))
    a = holdout_rows(78, 0.2, "random", torch.Generator().manual_seed(3))[1]
    b = holdout_rows(78, 0.2, "random", torch.Generator().manual_seed(4))[1]
    assert torch.equal(a, holdout_rows(78, 0.2, "random", torch.Generator().manual_seed(3))[1]) and not torch.equal(a, b)
    assert len(holdout_rows(4, 0.2, "random", torch.Generator())[1]) == 0  # floor(0.8) = 0: nothing held out


def test_fedfomo_weights_are_computed_on_the_held_out_rows_only(tiny_fed, monkeypatch):
    import fedblend.algorithms.fedfomo as fomo

    seen = []
    real = fomo.evaluate_params
    monkeypatch.setattr(fomo, "evaluate_params", lambda model, p, x, y: seen.append((x, y)) or real(model, p, x, y))
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2, "holdout": 0.25, "holdout_pick": "last"}, rounds=2, seed=0)
    sim.run()
    n = [c.num_train for c in tiny_fed.clients]
    # round 1: each client scores its own model (1 call); round 2: its own and the two received (3 calls each)
    assert len(seen) == 4 * 1 + 4 * 3
    calls = iter(seen)
    for _rnd in range(2):
        for cid, c in enumerate(tiny_fed.clients):
            held = torch.arange(n[cid] - int(0.25 * n[cid]), n[cid])
            for _ in range(1 if _rnd == 0 else 3):
                x, y = next(calls)
                assert torch.equal(x, c.train_x[held]) and torch.equal(y, c.train_y[held])


def test_fedfomo_training_never_sees_the_held_out_rows(tiny_fed):
    from fedblend.core.vmap import VmapBackend

    poisoned = _poison_rows(tiny_fed, _last_rows(0.25))
    opts = {"m": 2, "holdout": 0.25, "holdout_pick": "last"}
    for backend in (None, VmapBackend()):
        runs = []
        for fed in (tiny_fed, poisoned):
            sim = tiny_sim(fed, "fedfomo", opts, rounds=1, seed=0, backend=backend)
            sim.run()
            runs.append(sim.server["models"])
        # round 1 receives nothing: the uploads are the local training alone, equal whatever the held-out rows hold
        assert same_state(runs[0], runs[1])
    # without the hold-out the same rows are trained on, and the uploads differ
    runs = []
    for fed in (tiny_fed, poisoned):
        sim = tiny_sim(fed, "fedfomo", {"m": 2, "holdout": 0.0}, rounds=1, seed=0)
        sim.run()
        runs.append(sim.server["models"])
    assert not same_state(runs[0], runs[1])


def test_fedfomo_holdout_is_drawn_once_per_client_from_the_seed_tree(tiny_fed, monkeypatch):
    from fedblend.algorithms.fedfomo import holdout_rows
    from fedblend.common.rng import SeedTree

    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=3, seed=5)  # defaults: 0.2 held out at random
    sim.run()
    for cid, c in enumerate(tiny_fed.clients):
        keep, held = holdout_rows(c.num_train, 0.2, "random", SeedTree(5).torch("fedfomo-holdout", cid))
        reply = run_client(sim, cid, train_message(sim, cid)).reply
        assert reply.metrics["num_samples"] == c.num_train - int(0.2 * c.num_train) == len(keep)
    # the same rows every round: only the held-out rows' contents matter to the weights, so poisoning them
    # changes the run from round 2 on (when there are models to weigh) but never round 1
    poisoned = _poison_rows(tiny_fed, lambda cid, n: holdout_rows(n, 0.2, "random",
                                                                  SeedTree(5).torch("fedfomo-holdout", cid))[1])
    other = tiny_sim(poisoned, "fedfomo", {"m": 2}, rounds=1, seed=5)
    other.run()
    first = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=1, seed=5)
    first.run()
    assert same_state(first.server["models"], other.server["models"])


def test_fedfomo_without_holdout_scores_and_trains_on_the_whole_training_split(tiny_fed, monkeypatch):
    import fedblend.algorithms.fedfomo as fomo

    seen = []
    real = fomo.evaluate_params
    monkeypatch.setattr(fomo, "evaluate_params", lambda model, p, x, y: seen.append(x) or real(model, p, x, y))
    for opts in ({"holdout": 0.0}, {"val_split": "train"}):
        seen.clear()
        sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2, **opts}, rounds=1, seed=0)
        sim.run()
        assert [x.shape[0] for x in seen] == [c.num_train for c in tiny_fed.clients]
        reply = run_client(sim, 0, train_message(sim, 0)).reply
        assert reply.metrics["num_samples"] == tiny_fed.clients[0].num_train


def test_fedfomo_uses_the_runs_validation_split_and_holds_nothing_out(tiny_fed, monkeypatch):
    from dataclasses import replace

    import fedblend.algorithms.fedfomo as fomo

    # a validation split of 6 noise samples per client, as partition.split = "train_val_test" would give
    gen = torch.Generator().manual_seed(0)
    fed = replace(tiny_fed, clients=[replace(c, val_x=torch.randn((6, *c.train_x.shape[1:]), generator=gen),
                                             val_y=c.train_y[:6].clone()) for c in tiny_fed.clients])
    seen = []
    real = fomo.evaluate_params
    monkeypatch.setattr(fomo, "evaluate_params", lambda model, p, x, y: seen.append(x) or real(model, p, x, y))
    sim = tiny_sim(fed, "fedfomo", {"m": 2}, rounds=1, seed=0)
    sim.run()
    assert all(torch.equal(x, c.val_x) for x, c in zip(seen, fed.clients))
    assert run_client(sim, 1, train_message(sim, 1)).reply.metrics["num_samples"] == fed.clients[1].num_train


def test_fedfomo_reports_the_share_of_clients_whose_model_moved(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=3, seed=0)
    sim.run()
    assert "fomo_moved" not in sim.history[0]  # nothing received in round 1
    assert all(0.0 <= h["fomo_moved"] <= 1.0 for h in sim.history[1:])


def test_fedfomo_client_left_without_a_batch_by_the_holdout_trains_nothing_and_is_no_divergence(tiny_fed):
    n = min(c.num_train for c in tiny_fed.clients)
    small = min(range(4), key=lambda c: tiny_fed.clients[c].num_train)
    bs = n - int(0.2 * n) + 1  # the smallest client keeps one row fewer than a batch (PFLlib: 63 kept, batch 64)
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=2, seed=0, batch_size=bs, drop_last=True)
    sim.run()
    assert all(h["train_loss"] == h["train_loss"] for h in sim.history)  # finite: the other clients' mean
    init = sim.run_info.init_params
    first = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=1, seed=0, batch_size=bs, drop_last=True)
    first.run()
    assert same_state(first.server["models"][str(small)], dict(init))  # round 1: nothing received, nothing trained


# ------------------------------------------------------------------------------- PFLlib's variant, as options
# clientfomo.py / serverfomo.py (d832e76): L_i and the distances from old_model (the model before the last local
# training), P = eye with the client's own upload a candidate, P grown by the raw gains.


def test_fedfomo_raw_gains_by_hand_keep_their_sign():
    from fedblend.algorithms.fedfomo import raw_gains

    g = raw_gains(1.0, [0.5, 1.2, 0.8, 0.1], [2.0, 1.0, 0.5, 0.0])
    assert torch.allclose(g, torch.tensor([0.25, -0.2, 0.4, 0.0], dtype=torch.float64))  # distance 0: 0


def test_fedfomo_include_self_starts_p_at_the_identity_and_sends_the_clients_own_upload(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2, "include_self": True, "epsilon": 0.0}, rounds=1, seed=0)
    assert torch.equal(sim.server["affinity"], torch.eye(4, dtype=torch.float64))
    sim.run()
    for cid in range(4):  # own affinity 1 beats every other's 0: the client's own upload is always among the M
        ids = train_message(sim, cid).config["ids"]
        assert cid in ids and len(ids) == 2
    paper = tiny_sim(tiny_fed, "fedfomo", {"m": 2, "epsilon": 0.0}, rounds=1, seed=0)
    paper.run()
    assert all(cid not in train_message(paper, cid).config["ids"] for cid in range(4))


@pytest.mark.parametrize("affinity", ["weights", "raw"])
def test_fedfomo_before_training_baseline_scores_from_the_model_the_client_last_trained_from(tiny_fed, affinity):
    """Round 2 by hand: with ``baseline = "before_training"`` the client keeps the model it started its last
    training from (``fomo_start``); ``L_i`` and the distances are taken from it, the update is Eq. 5's normalised
    mix (its own trained model unchanged when no weight is positive), and ``P``'s row grows by the weights or the
    raw gains."""
    from fedblend.algorithms.fedfomo import distance, fomo_update, fomo_weights, raw_gains
    from fedblend.core.evaluation import evaluate_params
    from tests.methods.common import specs_of

    opts = {"m": 3, "include_self": True, "baseline": "before_training", "affinity": affinity, "epsilon": 0.0,
            "holdout": 0.0}
    sim = tiny_sim(tiny_fed, "fedfomo", opts, rounds=2, seed=0)
    start = {n: t.clone() for n, t in sim.run_info.init_params.items()}
    sim.run_round()
    state = sim.store.get(0)
    assert all(torch.equal(state["fomo_start"][n], start[n]) for n in start)  # round 1 trained from the initial model
    msg = train_message(sim, 0)
    models = [msg.params(f"m{k}") for k in range(len(msg.config["ids"]))]
    ctx = sim.client_ctx(0, sim.next_round)
    x, y = ctx.data.train_x, ctx.data.train_y
    loss = [lo / n for _, lo, n in (evaluate_params(ctx.model, p, x, y) for p in [start, *models])]
    dist = [distance(m, start) for m in models]
    want_w = fomo_weights(loss[0], loss[1:], dist)
    assert float(want_w.sum()) > 0  # something moves (the client's own trained upload at least)
    want = fomo_update(state["params"], models, want_w)
    log, reply, after = specs_of(sim, 0, msg, state)
    assert all(torch.allclose(log[0][0].params[n], want[n], atol=1e-6) for n in want)  # trained from Eq. 5's mix
    assert all(torch.allclose(after["fomo_start"][n], want[n], atol=1e-6) for n in want)
    grows = raw_gains(loss[0], loss[1:], dist) if affinity == "raw" else want_w
    assert torch.allclose(torch.tensor(reply.metrics["fomo_weights"], dtype=torch.float64), grows, atol=1e-9)
