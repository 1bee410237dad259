"""FedProto: prototypes and their weighted average (Eq. 4-6), the prototype loss, nearest-prototype evaluation, what
travels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.fedproto import average_prototypes, prototype_logits, prototype_loss, prototype_scores
from fedblend.algorithms.parts.prototypes import class_prototypes
from fedblend.core.evaluation import EvalProtocol, EvalSpec
from fedblend.core.training import Batch, Forward
from tests.helpers import eval_message, run_client, same_state, tiny_sim, train_message
from tests.methods.common import client_params

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_fedproto_prototype_forward_is_nearest_prototype(tiny_fed):
    """The evaluated forward classifies the body's features by the nearest prototype, with the distance
    classifier's softmax; the client's own head plays no part, and a class without a prototype is never chosen."""
    sim = tiny_sim(tiny_fed, "fedproto", rounds=1)
    model = sim.model
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    d = model.fc2.in_features
    protos = {str(c): torch.randn(d, generator=g) for c in (0, 1, 3)}
    forward = Forward(prototype_logits, prototype_scores(protos, model.fc2.out_features))
    x = torch.randn(50, *tiny_fed.clients[0].train_x.shape[1:], generator=g)
    logits = EvalSpec(params, forward).logits(model, x)
    f = functional_call(model, params, (x,), {"part": "features"})
    mat = torch.stack([protos[c] for c in ("0", "1", "3")])
    dist = torch.cdist(f, mat) ** 2
    assert torch.equal(logits.argmax(1), torch.tensor([0, 1, 3])[dist.argmin(1)])
    # the same softmax as the distance classifier -||f - C_j||^2 over the classes that have a prototype
    assert torch.allclose(F.softmax(logits, 1)[:, [0, 1, 3]], F.softmax(-dist, 1), atol=1e-5)
    other_head = {**params, "fc2.weight": params["fc2.weight"] + 1.0}
    assert torch.equal(EvalSpec(other_head, forward).logits(model, x), logits)


def test_fedproto_evaluates_through_the_prototype_forward_once_it_has_prototypes(tiny_fed):
    """``[eval] model = "proto"`` (default): the client's own model with the nearest-prototype forward after the
    first aggregation, its own head before; ``"head"``: always its own model."""
    sim = tiny_sim(tiny_fed, "fedproto", rounds=2, seed=1)
    ctx = sim.client_ctx(0, 0, "evaluate")
    assert sim.method.evaluate(eval_message(sim, 0), sim.store.get(0) or {"params": sim.run_info.init_params},
                               ctx).forward is None
    sim.run_round()
    spec = sim.method.evaluate(eval_message(sim, 0), sim.store.get(0), ctx)
    assert spec.forward is not None and spec.forward.fn is prototype_logits
    assert same_state(spec.params, sim.store.get(0)["params"])
    head = tiny_sim(tiny_fed, "fedproto", rounds=2, seed=1, protocol=EvalProtocol(model="head"))
    head.run_round()
    assert head.method.evaluate(eval_message(head, 0), head.store.get(0), ctx).forward is None


def test_fedproto_lambda_zero_with_own_head_is_local(tiny_fed):
    a = tiny_sim(tiny_fed, "fedproto", {"lam": 0.0}, rounds=3, seed=2, join_ratio=0.75,
                 protocol=EvalProtocol(model="head"))
    b = tiny_sim(tiny_fed, "local", rounds=3, seed=2, join_ratio=0.75)
    a.run(), b.run()
    assert same_state(client_params(a), client_params(b))
    assert [m["acc"] for m in a.history] == [m["acc"] for m in b.history]
    c = tiny_sim(tiny_fed, "fedproto", {"lam": 1.0}, rounds=3, seed=2, join_ratio=0.75,
                 protocol=EvalProtocol(model="head"))
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
    assert counts == [int((y == c).sum()) for c in range(len(counts))]
    assert len(counts) == sim.model.fc2.out_features  # every class of the output, zeros where absent
    assert res.reply.num_bytes == 4 * d * sum(n > 0 for n in counts)  # one float32 d-vector per class the client holds
    assert all(v.shape == (d,) for v in res.reply.params("protos").values())
    h = sim.history[0]
    fedavg = tiny_sim(tiny_fed, "fedavg", rounds=1, seed=0)
    fedavg.run_round()
    assert max(h["bytes_up"]) < min(fedavg.history[0]["bytes_up"]) / 10


def test_fedproto_a_class_nobody_uploaded_keeps_its_prototype_unless_dropped(tiny_fed):
    """absent = "keep" (default): a class no client of the round uploaded keeps its last global prototype, so the
    clients holding it can still be scored; "drop" (authors' code, PFLlib) loses it. Uploaded classes are the
    round's average either way."""
    from fedblend.algorithms.parts.prototypes import COUNTS, PROTOS
    from fedblend.core.method import Message

    old = {"0": torch.tensor([1.0, 1.0]), "1": torch.tensor([7.0, 7.0])}
    reply = Message({PROTOS: {"0": torch.tensor([3.0, 5.0])}}, {COUNTS: [4, 0]})
    for absent, want in (("keep", {"0", "1"}), ("drop", {"0"})):
        sim = tiny_sim(tiny_fed, "fedproto", rounds=1, options={"absent": absent})
        new = sim.method.aggregate_train({"protos": old}, {2: reply}, sim.sctx(0))["protos"]
        assert set(new) == want
        assert torch.allclose(new["0"].float(), torch.tensor([3.0, 5.0]))
        if absent == "keep":
            assert torch.equal(new["1"], old["1"])
