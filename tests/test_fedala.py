"""ALA (FedALA Eq. 4-5, Alg. 1) and the methods built from it: fedala, fedavg+ala, fedprox+ala."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedblend.algorithms import build_method
from fedblend.algorithms.ala import ALA
from fedblend.algorithms.ala.learning import (
    ALAOptions,
    ala_names,
    ala_step,
    blend,
    converged,
    learn_weights,
    sample_indices,
)
from fedblend.common.params import clone
from fedblend.common.rng import SeedTree
from fedblend.config import load_config
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.method import ClientCtx, RunInfo
from fedblend.core.training import TrainConfig
from fedblend.models.zoo import MLP, build_model, model_params
from tests.helpers import eval_message, tiny_sim

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def _toy(seed: int = 0):
    """A 3-2-2 MLP with distinct local / global parameters and 4 samples."""
    g = torch.Generator().manual_seed(seed)
    model = MLP(3, 2, hidden=2).requires_grad_(False)
    local = {k: torch.randn(v.shape, generator=g) for k, v in model_params(model).items()}
    glob = {k: torch.randn(v.shape, generator=g) for k, v in model_params(model).items()}
    x = torch.randn(4, 3, generator=g)
    y = torch.tensor([0, 1, 1, 0])
    return model, local, glob, x, y


def _ctx(model, x, y, cid=0, rnd=1, batch_size=64, seed=0):
    from fedblend.data.federated import ClientData

    empty = torch.zeros(0, *x.shape[1:])
    data = ClientData(x, y, empty, torch.zeros(0, dtype=torch.long), empty, torch.zeros(0, dtype=torch.long))
    run = RunInfo(model=model, init_params=model_params(model), train=TrainConfig(batch_size=batch_size),
                  num_clients=1, rounds=3, seed=seed)
    return ClientCtx(cid, rnd, data, run, SeedTree(seed).child("train", "round", rnd, "client", cid))


# ------------------------------------------------------------------------------------------------ the update
def test_step_equals_hand_computed_gradient_then_clip():
    model, local, glob, x, y = _toy()
    w0 = {n: torch.full_like(glob[n], 0.5) for n in ("fc2.weight", "fc2.bias")}
    eta = 2.0
    # by hand: lower layer (fc1) is the global one; top layer theta_hat = local/2 + global/2
    h = torch.relu(x @ glob["fc1.weight"].T + glob["fc1.bias"])
    wt = 0.5 * local["fc2.weight"] + 0.5 * glob["fc2.weight"]
    bt = 0.5 * local["fc2.bias"] + 0.5 * glob["fc2.bias"]
    prob = torch.softmax(h @ wt.T + bt, 1)
    err = (prob - F.one_hot(y, 2).float()) / len(y)  # dL/dlogits of the mean cross-entropy
    g_w, g_b = err.T @ h, err.sum(0)  # dL/dtheta_hat for weight and bias
    want_w = (0.5 - eta * g_w * (glob["fc2.weight"] - local["fc2.weight"])).clamp(0, 1)
    want_b = (0.5 - eta * g_b * (glob["fc2.bias"] - local["fc2.bias"])).clamp(0, 1)
    want_loss = float(-torch.log(prob[torch.arange(4), y]).mean())
    # the toy is chosen so that clipping acts on both sides
    both = torch.cat([want_w.flatten(), want_b])
    assert (both == 0).any() and (both == 1).any() and ((both > 0) & (both < 1)).any()

    new, loss = ala_step(model, local, glob, w0, x, y, eta)
    assert torch.allclose(new["fc2.weight"], want_w, atol=1e-6)
    assert torch.allclose(new["fc2.bias"], want_b, atol=1e-6)
    assert loss == pytest.approx(want_loss, rel=1e-6)

    # the same step through learn_weights (s = 100, one batch, a later round = one epoch), then Eq. 4
    opts = ALAOptions(eta=eta, s=100.0)
    res = learn_weights(model, local, glob, w0, x, y, opts, batch_size=4, generator=torch.Generator(),
                        initial=False)
    assert res.epochs == 1 and not res.initial
    assert torch.allclose(res.weights["fc2.weight"], want_w, atol=1e-6)
    assert torch.equal(res.params["fc1.weight"], glob["fc1.weight"])  # lower layers: overwritten by global
    want_top = local["fc2.weight"] * (1 - res.weights["fc2.weight"]) + glob["fc2.weight"] * res.weights["fc2.weight"]
    assert torch.equal(res.params["fc2.weight"], want_top)


def test_blend_endpoints_are_exact():
    _, local, glob, _, _ = _toy(1)
    ones = {n: torch.ones_like(glob[n]) for n in glob}
    zeros = {n: torch.zeros_like(glob[n]) for n in glob}
    assert all(torch.equal(blend(local, glob, ones)[n], glob[n]) for n in glob)  # FedAvg's overwrite
    assert all(torch.equal(blend(local, glob, zeros)[n], local[n]) for n in glob)  # keep the local model


# ------------------------------------------------------------------------------------------------ p, sample
def test_p_selects_exactly_the_top_p_layers():
    lenet = build_model("lenet5", {"in_channels": 1, "image_size": 28, "num_classes": 10})
    assert ala_names(lenet, 1) == ["fc3.weight", "fc3.bias"]
    assert ala_names(lenet, 2) == ["fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    cnn = build_model("cnn4", {"in_channels": 1, "image_size": 28, "num_classes": 10})
    assert ala_names(cnn, 1) == ["fc.weight", "fc.bias"]  # paper p=1 = reference code layer_idx=2
    assert sum(lenet.state_dict()[n].numel() for n in ala_names(lenet, 1)) == 84 * 10 + 10
    with pytest.raises(ValueError):
        ala_names(lenet, 6)

    model, local, glob, x, y = _toy(2)
    for p, top in ((1, {"fc2.weight", "fc2.bias"}), (2, {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})):
        t = ALA(ALAOptions(p=p, eta=5.0, threshold=1e9))
        hat, cs = t.apply(None, dict(glob), {"params": local}, _ctx(model, x, y))
        assert set(cs["ala"]["weights"]) == top
        for n in glob:  # tensors outside the range are exactly the global ones
            if n not in top:
                assert torch.equal(hat[n], glob[n])
        assert any(not torch.equal(hat[n], glob[n]) for n in top)


def test_sample_modes():
    g = torch.Generator().manual_seed(0)
    r = sample_indices(50, 80.0, "random", g)
    assert len(r) == 40 and len(set(r.tolist())) == 40
    w = sample_indices(50, 80.0, "window", g)
    assert len(w) == 40 and torch.equal(w, torch.arange(int(w[0]), int(w[0]) + 40))
    assert len(sample_indices(3, 5.0, "random", g)) == 1  # at least one sample


# ------------------------------------------------------------------------------------------------ stages
def test_stop_rule():
    assert not converged([1.0] * 10, window=10, threshold=0.01)  # needs more than `window` losses
    assert converged([1.0] * 11, window=10, threshold=0.01)
    assert not converged([1.0, 1.1] * 6, window=10, threshold=0.01)  # std 0.05
    assert converged([5.0] + [1.0, 1.01] * 5, window=10, threshold=0.01)  # only the last 10 count


def test_initial_stage_stops_by_rule_or_cap_and_later_rounds_learn_one_epoch():
    model, local, glob, x, y = _toy(3)
    w0 = {n: torch.ones_like(glob[n]) for n in ("fc2.weight", "fc2.bias")}
    kw = dict(batch_size=2, generator=torch.Generator().manual_seed(0))
    res = learn_weights(model, local, glob, w0, x, y, ALAOptions(threshold=1e9, window=4), initial=True, **kw)
    assert res.epochs == 5 and not res.capped  # first moment the rule can hold: window + 1 losses
    res = learn_weights(model, local, glob, w0, x, y, ALAOptions(threshold=0.0, cap=7), initial=True, **kw)
    assert res.epochs == 7 and res.capped  # threshold 0 can never be met: the cap ends it
    res = learn_weights(model, local, glob, w0, x, y, ALAOptions(threshold=0.0), initial=False, **kw)
    assert res.epochs == 1

    # through the transform: the cap warns, the initial stage happens once, the next call learns one epoch
    t = ALA(ALAOptions(threshold=0.0, cap=3))
    with pytest.warns(RuntimeWarning, match="cap of 3 epochs"):
        _, cs = t.apply(None, dict(glob), {"params": local}, ctx := _ctx(model, x, y))
    assert ctx.stats["ala_epochs"] == 3 and ctx.stats["ala_capped"] == 1.0 and cs["ala"]["initial_done"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, cs = t.apply(None, dict(glob), cs, ctx := _ctx(model, x, y, rnd=2))
    assert ctx.stats["ala_epochs"] == 1 and ctx.stats["ala_initial"] == 0.0
    assert set(cs["ala"]) == {"weights", "initial_done"}  # no per-round record in the state (issue 22)


def test_initial_stage_stops_at_the_first_nonfinite_loss_with_a_warning():
    """A NaN in the received model makes every loss NaN, which no stop rule can meet: the initial stage ends
    after that epoch (not at the cap), says why, and the run's divergence check then reports it."""
    model, local, glob, x, y = _toy(5)
    glob = {**glob, "fc1.weight": glob["fc1.weight"].clone().fill_(float("nan"))}  # below ALA's top layer
    w0 = {n: torch.ones_like(glob[n]) for n in ("fc2.weight", "fc2.bias")}
    kw = dict(batch_size=2, generator=torch.Generator().manual_seed(0))
    res = learn_weights(model, local, glob, w0, x, y, ALAOptions(cap=50), initial=True, **kw)
    assert res.nonfinite and not res.capped and res.epochs == 1 and math.isnan(res.losses[-1])
    res = learn_weights(model, local, _toy(5)[2], w0, x, y, ALAOptions(cap=50), initial=True, **kw)
    assert not res.nonfinite and res.epochs > 1  # finite losses: the stop rule, as before
    with pytest.warns(RuntimeWarning, match="stopped at epoch 1: its loss is nan"):
        _, cs = ALA(ALAOptions(cap=50)).apply(None, dict(glob), {"params": local}, ctx := _ctx(model, x, y))
    assert ctx.stats["ala_epochs"] == 1 and ctx.stats["ala_capped"] == 0.0


def test_skipped_when_global_equals_local():
    model, local, glob, x, y = _toy(4)
    t = ALA()
    params = {**glob, "fc2.weight": local["fc2.weight"], "fc2.bias": local["fc2.bias"]}  # top layer equal
    ctx = _ctx(model, x, y)
    hat, cs = t.apply(None, params, {"params": local}, ctx)
    assert hat is params and cs["ala"]["weights"] is None and not cs["ala"]["initial_done"]
    assert ctx.stats["ala_skipped"] == 1.0 and "ala_epochs" not in ctx.stats


# ------------------------------------------------------------------------------------------------ in runs
def test_eta_zero_reduces_to_fedavg(tiny_fed):
    a = tiny_sim(tiny_fed, "fedavg", rounds=3)
    b = tiny_sim(tiny_fed, "fedavg+ala", transforms={"ala": {"eta": 0.0}}, rounds=3)
    a.run()
    b.run()
    assert b.history[0]["ala_skipped"] == 1.0 and b.history[1]["ala_skipped"] == 0.0  # ALA really ran
    assert b.history[1]["ala_epochs"] > 1  # including the initial stage
    assert all(torch.equal(a.server["global"][n], b.server["global"][n]) for n in a.server["global"])
    # W = 1: every evaluated theta_hat is the global model, so the personalized accuracy is FedAvg's every round
    assert [m["acc"] for m in a.history] == [m["acc"] for m in b.history]
    assert [m["train_loss"] for m in a.history] == [m["train_loss"] for m in b.history]
    for cid in range(tiny_fed.num_clients):
        assert all(torch.equal(w, torch.ones_like(w)) for w in b.store.get(cid)["ala"]["weights"].values())


def test_weights_persist_across_rounds_and_checkpoints(tiny_fed, tmp_path):
    ala = {"ala": {"eta": 2.0}}
    full = tiny_sim(tiny_fed, "fedavg+ala", transforms=ala, rounds=4)
    full.run()
    part = tiny_sim(tiny_fed, "fedavg+ala", transforms=ala, rounds=4)
    part.run_round()
    part.run_round()
    w2 = clone(part.store.get(0)["ala"]["weights"])
    assert any(not torch.equal(w, torch.ones_like(w)) for w in w2.values())  # learned, not the initial ones
    part.save(tmp_path / "checkpoint.pt")
    resumed = tiny_sim(tiny_fed, "fedavg+ala", transforms=ala, rounds=4)
    resumed.restore(tmp_path / "checkpoint.pt")
    assert all(torch.equal(w2[n], resumed.store.get(0)["ala"]["weights"][n]) for n in w2)
    resumed.run()
    assert resumed.history[2]["ala_epochs"] == 1.0  # initial stage not repeated: the flag came back too
    for cid in range(tiny_fed.num_clients):
        wf, wr = full.store.get(cid)["ala"]["weights"], resumed.store.get(cid)["ala"]["weights"]
        assert all(torch.equal(wf[n], wr[n]) for n in wf)
        assert set(full.store.get(cid)["ala"]) == {"weights", "initial_done"}
    # each learning client's diagnostics are in its round's metrics, resumed or not (W is learned from round 2)
    for run in (full, resumed):
        assert not any(k.startswith("ala_") for k in run.history[0]["stats_per_client"])  # only the losses
        for m in run.history[1:]:
            pc = m["stats_per_client"]
            assert pc["clients"] == m["selected"] == list(range(tiny_fed.num_clients))
            assert m["ala_epochs"] == sum(pc["ala_epochs"]) / len(pc["clients"])
            assert all(len(v) == len(pc["clients"]) for v in pc.values())
            assert any(k.startswith("ala_w_q50.") for k in pc) and "ala_seconds" not in pc
    assert [m["stats_per_client"] for m in full.history[1:]] == [m["stats_per_client"] for m in resumed.history[1:]]
    assert all(torch.equal(full.server["global"][n], resumed.server["global"][n]) for n in full.server["global"])
    assert [m["acc"] for m in full.history] == [m["acc"] for m in resumed.history]


def _state_bytes(state) -> int:
    """Size of a client state as it is checkpointed and shipped (``torch.save``)."""
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    return len(buf.getvalue())


def test_client_state_size_does_not_grow_with_rounds(tiny_fed):
    """Issue 22: ALA keeps only what the next round needs (W and the stage flag) in the client state; per-round
    diagnostics go to the round's metrics (``stats_per_client``), so the state does not grow with the rounds."""
    sim = tiny_sim(tiny_fed, "fedala", options={"eta": 2.0}, rounds=4)
    sim.run_round()
    sim.run_round()
    after2 = {cid: _state_bytes(sim.store.get(cid)) for cid in range(tiny_fed.num_clients)}
    assert all(sim.store.get(cid)["ala"]["weights"] is not None for cid in after2)  # W learned by round 2
    sim.run_round()
    sim.run_round()
    after4 = {cid: _state_bytes(sim.store.get(cid)) for cid in range(tiny_fed.num_clients)}
    assert after4 == after2


def test_fedala_is_fedavg_plus_ala_and_composes(tiny_fed):
    a = tiny_sim(tiny_fed, "fedala", options={"eta": 2.0}, rounds=3)
    b = tiny_sim(tiny_fed, "fedavg+ala", transforms={"ala": {"eta": 2.0}}, rounds=3)
    a.run()
    b.run()
    assert a.method.label == "fedala" and b.method.label == "fedavg+ala"
    assert [m["acc"] for m in a.history] == [m["acc"] for m in b.history]
    assert all(torch.equal(a.server["global"][n], b.server["global"][n]) for n in a.server["global"])
    with pytest.raises(ValueError, match="already runs ALA"):
        build_method("fedala+ala")
    c = tiny_sim(tiny_fed, "fedprox+ala", options={"mu": 0.1}, transforms={"ala": {"eta": 2.0}}, rounds=3)
    c.run()
    assert c.history[-1]["ala_skipped"] == 0.0 and c.store.get(0)["ala"]["weights"] is not None
    assert not all(torch.equal(c.server["global"][n], b.server["global"][n]) for n in b.server["global"])


def test_ala_hosts_are_the_methods_with_a_global_model_and_fedamp():
    """ALA blends the model a client receives (FedALA Eq. 4's theta) with its own: every method with a global model
    that accepts transforms hosts it, as before, and of those without one only FedAMP (its personalized u_i; FedALA
    Table 4), which declares ``trains_from_received``; undeclared, the trait is ``global_model``."""
    from fedblend.algorithms import METHODS, build_method
    from fedblend.core.method import Method, Traits
    from tests.test_shared_suite import hosts

    with_global = {m for m in METHODS if build_method(m).traits.global_model
                   and build_method(m).traits.accepts_transforms and m != "fedala"}
    assert set(hosts("ala")) == with_global | {"fedamp"}
    assert Method().traits.trains_from_received

    class NoGlobal(Method):
        def declare(self, choice):
            return Traits(global_model=False)

    assert not NoGlobal().traits.trains_from_received


def test_eval_modes_do_not_disturb_training(tiny_fed):
    runs = {}
    for mode in ("ala", "stored", "trained"):
        s = tiny_sim(tiny_fed, "fedavg+ala", transforms={"ala": {"eta": 2.0}}, rounds=3,
                     protocol=EvalProtocol(model=mode))
        s.run()
        runs[mode] = s
    g = runs["ala"].server["global"]
    for mode in ("stored", "trained"):  # identical training whatever is evaluated
        assert all(torch.equal(g[n], runs[mode].server["global"][n]) for n in g)
    assert runs["ala"].history[-1]["loss"] != runs["trained"].history[-1]["loss"]
    sim = runs["ala"]
    before = clone(sim.store.get(1)["ala"]["weights"])
    e1 = sim.evaluate(2)
    e2 = sim.evaluate(2)
    assert e1 == e2  # eval streams are fixed by (seed, round, client)
    assert all(torch.equal(before[n], sim.store.get(1)["ala"]["weights"][n]) for n in before)  # nothing kept
    # "stored": Eq. 4 with the stored W and the aggregated global model
    st = runs["stored"]
    cs = st.store.get(1)
    got = st.method.eval_params(eval_message(st, 1), cs, st.client_ctx(1, 2, "evaluate"))
    want = blend(cs["params"], st.server["global"], cs["ala"]["weights"])
    assert all(torch.equal(got[n], want[n]) for n in want)
    # "trained": the client's own model after local training
    tr = runs["trained"]
    got = tr.method.eval_params(eval_message(tr, 1), tr.store.get(1), tr.client_ctx(1, 2, "evaluate"))
    assert got is tr.store.get(1)["params"]
    assert "ALA-initialised" in sim.method.traits.eval_model


def test_stats_and_options_validation(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedavg+ala", rounds=2)
    sim.run()
    m = sim.history[1]
    for k in ("ala_seconds", "ala_epochs", "ala_w_mean.fc2", "ala_w_q10.fc2", "ala_w_q50.fc2", "ala_w_q90.fc2"):
        assert k in m
    assert 0 < m["ala_seconds"] < m["client_seconds"] < m["seconds"]
    # ALA's share of the round's client work = sum of ala_seconds / sum of client_seconds (4 clients, all join)
    assert m["ala_share"] == pytest.approx(m["ala_seconds"] / m["client_seconds"])
    assert 0.0 < m["ala_share"] < 1.0
    plain = tiny_sim(tiny_fed, "fedavg", rounds=1)
    assert "client_seconds" in plain.run_round() and not any(k.endswith("_share") for k in plain.history[0])
    assert 0.0 <= m["ala_w_q10.fc2"] <= m["ala_w_q50.fc2"] <= m["ala_w_q90.fc2"] <= 1.0
    from fedblend.common.options import ConfigError
    for bad in ({"s": 0}, {"s": 120}, {"p": 0}, {"eta": -1}, {"sample": "block"}, {"eval": "ala"}):
        with pytest.raises(ConfigError):  # ALA's eval is [eval] model now: no option of ALA's
            build_method("fedavg+ala", None, {"ala": bad})
    with pytest.raises(ValueError, match="not one of its choices: 'ala', 'stored', 'trained'"):
        build_method("fedavg+ala", eval_choice="final")


@pytest.mark.parametrize("name,method", [
    ("t1-fmnist-pat-fedala", "fedala"), ("t1-fmnist-dir-fedala", "fedala"),
    ("t1-fmnist-dir-fedavg+ala", "fedavg+ala"), ("t1-fmnist-dir-fedprox+ala", "fedprox+ala"),
    ("t1-fmnist-dir-fedprox", "fedprox"), ("t3-mnist-pat-fedavg", "fedavg"),
    ("t3-mnist-pat-fedavg-ft", "fedavg-ft"), ("t3-mnist-pat-fedala", "fedala")])
def test_benchmark_configs_load(name, method):
    cfg = load_config(REPO / "configs" / "benchmarks" / f"{name}.toml")
    assert cfg.name == name and cfg.method == method
    cfg.build_method()
    if name.startswith("t3"):
        assert (cfg.dataset, cfg.model, cfg.partition.kind, cfg.partition.rule) == ("mnist", "cnn4", "pathological",
                                                                                    "pflib")
        assert (cfg.train.lr, cfg.train.momentum, cfg.train.batch_size, cfg.train.epochs) == (0.1, 0.0, 10, 1)
        assert cfg.sampling.join_ratio == 1.0 and cfg.partition.split == "merge"
    else:
        ref = load_config(REPO / "configs" / "benchmarks" / f"t1-fmnist-{name.split('-')[2]}-fedavg.toml")
        assert (cfg.train, cfg.sampling, cfg.partition, cfg.eval, cfg.rounds) == (
            ref.train, ref.sampling, ref.partition, ref.eval, ref.rounds)


def test_weights_script_draws_png(tiny_fed, tmp_path):
    pytest.importorskip("matplotlib")
    import json
    import subprocess
    import sys

    sim = tiny_sim(tiny_fed, "fedala", rounds=3)
    sim.run()
    sim.save(tmp_path / "checkpoint.pt")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in sim.history))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "ala_weights.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "ala_weights.png").stat().st_size > 0
    assert "ala_share" in out.stdout


def test_evaluation_learns_the_blend_training_then_reuses(tiny_fed, monkeypatch):
    """eval_stream = "train": evaluation learns W on the next round's training stream, training reuses it (W is
    learned once per round, not twice), and training does not depend on whether or how often evaluation runs."""
    import fedblend.algorithms.ala as ala_mod

    calls = []
    real = ala_mod.learn_weights

    def counting(*args, **kw):
        calls.append(kw.get("initial"))
        return real(*args, **kw)

    monkeypatch.setattr(ala_mod, "learn_weights", counting)
    every = tiny_sim(tiny_fed, "fedavg+ala", rounds=3)
    every.run()
    assert len(calls) == 3 * 4  # 4 clients x 3 evaluations; rounds 2-3 training reused the evaluation's learning
    calls.clear()
    rare = tiny_sim(tiny_fed, "fedavg+ala", rounds=3)
    rare.protocol = type(rare.protocol)(every=100)  # evaluated only at the last round
    rare.run()
    assert len(calls) == 2 * 4 + 4  # training learns W itself in rounds 2-3, then the final evaluation
    assert all(torch.equal(every.server["global"][n], rare.server["global"][n]) for n in every.server["global"])
    assert [m["train_loss"] for m in every.history] == [m["train_loss"] for m in rare.history]
    assert every.history[-1]["acc"] == rare.history[-1]["acc"]  # the same evaluation at the last round


def test_ala_feature_cache_is_exact():
    """Learning with the frozen body's features computed once per batch equals the full forward every epoch."""
    model, local, glob, x, y = _toy(3)
    names = ["fc2.weight", "fc2.bias"]
    w0 = {n: torch.full_like(glob[n], 0.7) for n in names}
    opts = ALAOptions(eta=1.0, s=100.0, threshold=0.0, cap=5)
    res = learn_weights(model, local, glob, w0, x, y, opts, 2, torch.Generator().manual_seed(0), initial=True)
    w = dict(w0)
    idx = sample_indices(len(y), 100.0, "random", torch.Generator().manual_seed(0))
    for _ in range(res.epochs):
        for b in torch.split(idx, 2):
            w, _ = ala_step(model, local, glob, w, x[b], y[b], 1.0)  # the full forward pass, no cache
    assert res.epochs == 5 and all(torch.equal(res.weights[n], w[n]) for n in names)
