"""FedGH: the server-side header step (with momentum) and training on the uploaded prototypes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedblend.algorithms.fedgh import header_step
from tests.helpers import run_client, same_state, tiny_sim, train_message, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedgh_header_step_by_hand(tiny_fed):
    model = tiny_sim(tiny_fed, "fedgh", rounds=1).model
    g = torch.Generator().manual_seed(1)
    c, d = model.fc2.out_features, model.fc2.in_features
    head = {"fc2.weight": torch.randn(c, d, generator=g), "fc2.bias": torch.randn(c, generator=g)}
    feats, labels = torch.randn(5, d, generator=g), torch.tensor([0, 1, 1, 3, 0])
    new, buf, loss = header_step(model, head, feats, labels, lr=0.1)
    logits = feats @ head["fc2.weight"].T + head["fc2.bias"]
    err = (F.softmax(logits, 1) - F.one_hot(labels, c).float()) / len(labels)  # dCE/dlogits, mean over the batch
    assert torch.allclose(new["fc2.weight"], head["fc2.weight"] - 0.1 * err.T @ feats, atol=1e-6)
    assert torch.allclose(new["fc2.bias"], head["fc2.bias"] - 0.1 * err.sum(0), atol=1e-6)
    assert loss == pytest.approx(float(F.cross_entropy(logits, labels)), rel=1e-5) and buf is None
    # momentum: b = m b + g, the torch.optim.SGD rule
    new2, buf2, _ = header_step(model, new, feats, labels, lr=0.1, momentum=0.5, buf={"fc2.bias": err.sum(0)})
    logits2 = feats @ new["fc2.weight"].T + new["fc2.bias"]
    err2 = (F.softmax(logits2, 1) - F.one_hot(labels, c).float()) / len(labels)
    assert torch.allclose(buf2["fc2.bias"], 0.5 * err.sum(0) + err2.sum(0), atol=1e-6)
    assert torch.allclose(new2["fc2.bias"], new["fc2.bias"] - 0.1 * buf2["fc2.bias"], atol=1e-6)


def test_fedgh_prototypes_up_header_down(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedgh", rounds=3, seed=0)
    head_names = sim.model.head_names()
    msg = train_message(sim, 1)
    assert set(msg.arrays) == {"header"} and sorted(msg.params("header")) == sorted(head_names)
    res = run_client(sim, 1, msg)
    assert set(res.reply.arrays) == {"protos"}
    sim.run_round()
    # the server trained its header on the uploads; every client now receives it and evaluates with it
    assert not same_state(sim.server["header"], msg.params("header"))
    ev = sim.method.configure_evaluate(sim.server, 1, sim.sctx(1))
    params = sim.method.eval_params(ev, sim.store.get(1), sim.client_ctx(1, 1, "evaluate"))
    assert all(torch.equal(params[n], sim.server["header"][n]) for n in head_names)
    body = [n for n in params if n not in head_names]
    assert all(torch.equal(params[n], sim.store.get(1)["params"][n]) for n in body)
    # the client trains from its own body under the received header (header substitution)
    start = sim.method.client_init(ev, sim.store.get(1), sim.client_ctx(1, 1))
    assert all(torch.equal(start[n], sim.server["header"][n]) for n in head_names)


def test_fedgh_server_momentum_is_state_and_resumes(tiny_fed, tmp_path):
    sim = tiny_sim(tiny_fed, "fedgh", {"server_momentum": 0.9}, rounds=3, seed=3)
    sim.run_round()
    assert set(sim.server["header_momentum"]) == set(sim.model.head_names())
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, "fedgh", {"server_momentum": 0.9}, rounds=3, seed=3)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)


def test_fedgh_header_start_client0_trains_on_from_client0s_trained_header(tiny_fed):
    """``header_start = "client0"`` (PFLlib's server header is client 0's head module): client 0 uploads its
    trained header and the server's header training starts from it; the other clients upload prototypes only."""
    sim = tiny_sim(tiny_fed, "fedgh", {"header_start": "client0"}, rounds=2, seed=0)
    plain = tiny_sim(tiny_fed, "fedgh", rounds=2, seed=0)
    head_names = sorted(sim.model.head_names())
    replies = {cid: run_client(sim, cid, train_message(sim, cid)).reply for cid in range(sim.fed.num_clients)}
    assert sorted(replies[0].params("header")) == head_names
    assert all(set(r.arrays) == {"protos"} for cid, r in replies.items() if cid != 0)
    sent = sim.server["header"]
    assert not same_state(replies[0].params("header"), sent)  # client 0's training moved its header
    assert same_state(sim.method._start_header(sim.server, replies), replies[0].params("header"))
    without0 = {cid: r for cid, r in replies.items() if cid != 0}
    assert same_state(sim.method._start_header(sim.server, without0), sent)
    assert same_state(plain.method._start_header(plain.server, replies), plain.server["header"])
    sim.run_round(), plain.run_round()
    assert not same_state(sim.server["header"], plain.server["header"])
