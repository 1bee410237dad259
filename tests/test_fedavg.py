import torch
from torch import nn

from fedblend.algorithms import build_method
from fedblend.algorithms.parts.proximal import proximal_term
from fedblend.common.params import weighted_average
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.message import Message
from fedblend.core.training import TrainConfig, sgd_train
from tests.helpers import eval_message, run_client, tiny_sim, train_message


def test_weighted_average_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(0.0)}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor(4.0)}
    out = weighted_average([a, b], [1, 3])  # (1*a + 3*b) / 4
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert torch.allclose(out["b"], torch.tensor(3.0))


def test_fedavg_aggregate_equals_hand_computed(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedavg")
    m = sim.method
    ups = {0: Message({"params": {k: torch.full_like(v, 1.0) for k, v in sim.server["global"].items()}},
                      {"num_samples": 10}),
           2: Message({"params": {k: torch.full_like(v, 4.0) for k, v in sim.server["global"].items()}},
                      {"num_samples": 20})}
    new = m.aggregate("train", sim.server, ups, sim.sctx(0))
    for v in new["global"].values():
        assert torch.allclose(v, torch.full_like(v, (10 * 1 + 20 * 4) / 30))


def test_round_global_is_weighted_mean_of_client_models(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedavg", rounds=1)
    replies = [run_client(sim, c, train_message(sim, c)).reply for c in range(4)]  # what round 1's clients send
    sim.run_round()
    states = [r.params() for r in replies]
    n = [r.metrics["num_samples"] for r in replies]
    assert n == [c.num_train for c in tiny_fed.clients]
    for k, v in sim.server["global"].items():
        expect = sum(s[k] * w for s, w in zip(states, n)) / sum(n)
        assert torch.allclose(v, expect, atol=1e-6)


def test_sgd_train_matches_torch_optimizer():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    cfg = TrainConfig(lr=0.1, momentum=0.9, weight_decay=0.01, batch_size=8, epochs=2)
    res = sgd_train(model, params, x, y, cfg, torch.Generator().manual_seed(3))
    ref = nn.Linear(3, 2)
    ref.load_state_dict(params)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        for idx in torch.split(torch.randperm(20, generator=g), 8):
            opt.zero_grad()
            nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
            opt.step()
    for k, v in ref.named_parameters():
        assert torch.allclose(res.params[k], v.detach(), atol=1e-6)
    assert res.steps == 6 and res.samples == 40
    assert all(not v.requires_grad for v in res.params.values())


def test_sgd_train_trainable_subset_freezes_the_rest():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    res = sgd_train(model, params, torch.randn(10, 3), torch.randint(0, 2, (10,)), TrainConfig(lr=0.5, batch_size=5),
                    torch.Generator().manual_seed(0), trainable=["1.weight", "1.bias"])
    assert torch.equal(res.params["0.weight"], params["0.weight"])
    assert not torch.equal(res.params["1.weight"], params["1.weight"])


def test_fedprox_proximal_gradient():
    anchor = {"w": torch.tensor([1.0, -1.0])}
    w = torch.tensor([3.0, 0.0], requires_grad=True)
    loss = proximal_term(anchor, mu=0.5)({"w": w}, None)
    (g,) = torch.autograd.grad(loss, w)
    assert torch.allclose(loss, torch.tensor(0.25 * (4 + 1)))
    assert torch.allclose(g, 0.5 * (w.detach() - anchor["w"]))


def test_fedprox_mu_zero_equals_fedavg(tiny_fed):
    a = tiny_sim(tiny_fed, "fedavg", rounds=2)
    b = tiny_sim(tiny_fed, "fedprox", {"mu": 0.0}, rounds=2)
    a.run(), b.run()
    assert all(torch.equal(a.server["global"][k], b.server["global"][k]) for k in a.server["global"])
    c = tiny_sim(tiny_fed, "fedprox", {"mu": 1.0}, rounds=2)
    c.run()
    assert not all(torch.equal(a.server["global"][k], c.server["global"][k]) for k in a.server["global"])


def test_local_sends_nothing_and_keeps_own_model(tiny_fed):
    sim = tiny_sim(tiny_fed, "local", rounds=2)
    sim.run()
    assert all(sum(m["bytes_up"]) == 0 and sum(m["bytes_down"]) == 0 for m in sim.history)
    p0, p1 = sim.store.get(0)["params"], sim.store.get(1)["params"]
    assert not torch.equal(p0["fc1.weight"], p1["fc1.weight"])
    assert "global_acc" not in sim.history[-1]


def test_fedavg_ft_training_identical_to_fedavg(tiny_fed):
    """Fine-tuning uses its own random streams: the global trajectory equals FedAvg's bit for bit."""
    a = tiny_sim(tiny_fed, "fedavg", rounds=3)
    b = tiny_sim(tiny_fed, "fedavg-ft", rounds=3)
    ha, hb = a.run(), b.run()
    assert [m["global_acc"] for m in ha] == [m["global_acc"] for m in hb]
    assert [m["acc"] for m in ha] == [m["global_acc"] for m in ha]  # FedAvg evaluates the global model
    assert any(m["acc"] != m["global_acc"] for m in hb)  # the fine-tuned model is a different model


def test_fedavg_ft_with_transform_fine_tunes_the_transform_model(tiny_fed):
    """fedavg-ft+ala (``[eval] model = "trained"``): evaluation fine-tunes the client's own model, not the global
    one."""
    sim = tiny_sim(tiny_fed, "fedavg-ft+ala", rounds=2, protocol=EvalProtocol(model="trained"))
    sim.run()
    ctx = sim.client_ctx(0, 1, "evaluate")
    got = sim.method.eval_params(eval_message(sim, 0, 1), sim.store.get(0), ctx)
    want = sgd_train(sim.model, sim.store.get(0)["params"], ctx.data.train_x, ctx.data.train_y, sim.run_info.train,
                     ctx.tree.torch("finetune"), epochs=1).params
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(got["fc2.weight"], sim.store.get(0)["params"]["fc2.weight"])  # fine-tuning ran
    assert sim.method.traits.eval_model.endswith("then fine-tuned for ft_epochs on each client's training data")


def test_bytes_counted_per_client(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedavg", rounds=1, join_ratio=0.5)
    m = sim.run_round()
    size = sum(v.numel() * 4 for v in sim.run_info.init_params.values())
    assert len(m["selected"]) == 2 and m["bytes_down"] == [size, size] and m["bytes_up"] == [size, size]


def test_build_method_errors():
    import pytest

    with pytest.raises(ValueError, match="unknown method"):
        build_method("fedfoo")
    with pytest.raises(ValueError, match="unknown transform"):
        build_method("fedavg+zzz")
