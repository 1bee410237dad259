"""FedPHP: the HPM momentum schedule and moving average, the transfer losses (KD, MMD), the reduction to FedAvg."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.fedphp import FedPHPOptions, hpm_momentum, mmd, moving_average, transfer_loss
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.training import Batch
from tests.helpers import run_client, same_state, tiny_sim, train_message

pytestmark = pytest.mark.usefixtures("one_thread")


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
    batch = Batch(x, y, logits, None, model)
    got = transfer_loss(student, batch, init, 0.3, "kd", 4.0)
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


def test_fedphp_eval_trained_scores_the_last_trained_model_and_leaves_training_alone(tiny_fed):
    """``[eval] model = "trained"`` (what PFLlib evaluates) scores each client's last trained model, not its HPM; the
    training trajectory (global model, HPMs) is the default's, and the default keeps no model in the state."""
    runs = {e: tiny_sim(tiny_fed, "fedphp", {"mu": 0.9, "schedule": "round"}, rounds=3, seed=4,
                        protocol=EvalProtocol(model=e)) for e in ("hpm", "trained")}
    for sim in runs.values():
        sim.run()
    hpm, trained = runs["hpm"], runs["trained"]
    assert same_state(hpm.server, trained.server)
    for c, s in trained.store.states.items():
        assert "params" not in hpm.store.states[c]
        assert same_state(s["hpm"], hpm.store.states[c]["hpm"])
        msg = trained.method.configure_evaluate(trained.server, c, trained.sctx(3))
        assert trained.method.personalized_params(msg, s, trained.client_ctx(c, 3)) is s["params"]
    assert [m["acc"] for m in hpm.history] != [m["acc"] for m in trained.history]
