"""DBE: the representation bias (PRBM) in training and in the evaluated model's forward, the mean regulariser,
what travels."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from fedblend.algorithms.dbe import PRBM, mean_regulariser, prbm_forward, shifted_forward
from fedblend.core.evaluation import EvalProtocol, EvalSpec
from fedblend.core.training import Batch, Forward, TrainConfig, sgd_train
from fedblend.models.zoo import MLP
from tests.helpers import run_client, tiny_sim, train_message, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


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
    evaluated = EvalSpec({**params, PRBM: bias}, prbm_forward()).logits(model, x)
    assert torch.equal(shifted, evaluated)
    assert not torch.equal(EvalSpec(params).logits(model, x), evaluated)  # the bias does reach the logits


def test_dbe_training_adds_the_bias_to_the_features():
    """The bias gets the gradient of CE(h(f(x) + b)): one plain SGD step moves it by -lr * W^T dCE/dlogits."""
    torch.manual_seed(0)
    model = MLP(2, 3, hidden=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 2), torch.tensor([0, 1, 2, 0])
    b = torch.tensor([0.2, -0.1])
    cfg = TrainConfig(lr=0.1, batch_size=4, epochs=1)
    res = sgd_train(model, {**params, PRBM: b}, x, y, cfg, torch.Generator().manual_seed(0),
                    forward_fn=Forward(shifted_forward, {"key": PRBM}))
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


def test_dbe_init_pass_before_round_one_trains_every_round_with_dbe(tiny_fed):
    """``init_pass = "before"`` (the authors' code / PFLlib): round 1 opens with a plain training pass whose only
    result is zbar^g, so round 1 already trains the bias; the default trains round 1 as plain FedAvg."""
    before = tiny_sim(tiny_fed, "dbe", {"init_pass": "before"}, rounds=2, seed=3)
    plain = tiny_sim(tiny_fed, "dbe", rounds=2, seed=3)
    before.run_round(), plain.run_round()
    assert before.server["global_mean"] is not None and plain.server["global_mean"] is not None
    assert all(st["prbm"].abs().sum() > 0 for st in before.store.states.values())  # DBE acted in round 1
    assert all(st["prbm"].abs().sum() == 0 for st in plain.store.states.values())  # round 1 = init period
    # the pass costs one more download and upload per client in round 1, and only then
    assert all(b > 2 * p - 1 for b, p in zip(before.history[0]["bytes_down"], plain.history[0]["bytes_down"]))
    before.run_round(), plain.run_round()
    assert before.method.phases(before.sctx(1)) == ("train",)


def test_dbe_init_pass_is_discarded_and_gives_the_sample_weighted_mean(tiny_fed):
    """The pass changes no client state and not the global model; zbar^g is the sample-weighted mean of the
    clients' feature means of a plain training from the initial model."""
    from fedblend.algorithms.dbe import INIT
    from fedblend.core.client import ClientJob

    sim = tiny_sim(tiny_fed, "dbe", {"init_pass": "before"}, rounds=1, seed=3)
    runtime = sim.client_runtime()
    sctx = sim.sctx(0)
    replies, means, sizes = {}, [], []
    for cid in range(tiny_fed.num_clients):
        msg = sim.method.configure(INIT, sim.server, cid, sctx)
        assert "dbe" not in msg.arrays  # no global mean yet: plain training
        res = runtime.handle(ClientJob(INIT, cid, 0, msg, None))
        init_state = sim.method.init_client(runtime.ctx(cid, 0, INIT))
        assert set(res.state) == set(init_state) and all(torch.equal(res.state[k], init_state[k])
                                                          for k in init_state if torch.is_tensor(init_state[k]))
        replies[cid] = res.reply
        means.append(res.reply.params("dbe")["client_mean"])
        sizes.append(res.reply.metrics["num_samples"])
    out = sim.method.aggregate(INIT, sim.server, replies, sctx)
    expect = sum(m.double() * n for m, n in zip(means, sizes)) / sum(sizes)
    assert torch.allclose(out["global_mean"].double(), expect, atol=1e-6)
    assert all(torch.equal(out["global"][k], sim.server["global"][k]) for k in sim.server["global"])


def test_dbe_eval_trained_scores_each_clients_trained_model_with_its_bias(tiny_fed):
    """``[eval] model = "trained"``: each client's score is its model after its last local training with its bias
    (h(f(x) + zbar_i^p)); the default scores the received global model with the bias. Training is the same."""
    sims = {}
    for ev in ("received", "trained"):
        sims[ev] = tiny_sim(tiny_fed, "dbe", rounds=3, seed=2, protocol=EvalProtocol(model=ev))
        sims[ev].run()
    trained, received = sims["trained"], sims["received"]
    assert [m["train_loss"] for m in trained.history] == [m["train_loss"] for m in received.history]
    assert [m["acc"] for m in trained.history] != [m["acc"] for m in received.history]
    last = trained.history[-1]["per_client"]
    for cid, correct in zip(last["clients"], last["correct"]):
        state, data = trained.store.get(cid), tiny_fed.clients[cid]
        with torch.no_grad():
            feats = functional_call(trained.model, state["params"], (data.test_x,), {"part": "features"})
            z = feats + state["prbm"]
            pred = functional_call(trained.model, state["params"], (z,), {"part": "head"}).argmax(1)
        assert int((pred == data.test_y).sum()) == correct, cid
    assert "after its last local training" in trained.method.traits.eval_model
