"""FedRep and FedPer: FedRep's head-then-body phases and their momentum buffers, FedPer's joint training, body-only
messages evaluated with the own head."""

from __future__ import annotations

import pytest
import torch

from fedblend.common.params import select
from tests.helpers import eval_message, same_state, tiny_sim, train_message
from tests.methods.common import specs_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedrep_phases_train_only_their_tensors_and_keep_momentum(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedrep", {"head_epochs": 3}, rounds=2, momentum=0.5, optimizer_state="keep")
    head, body = sim.run_info.model.head_names(), sim.run_info.model.body_names()
    msg = train_message(sim, 0)
    log, reply, state = specs_of(sim, 0, msg)
    (s1, r1), (s2, r2) = log
    assert list(s1.trainable) == head and s1.epochs == 3 and s1.stream == "head"
    assert list(s2.trainable) == body and s2.epochs is None and s2.stream == "batches"
    assert same_state(select(r1.params, body), msg.params())  # head phase: body untouched
    assert not same_state(select(r1.params, head), select(sim.run_info.init_params, head))
    assert same_state(select(r2.params, head), select(r1.params, head))  # body phase: head untouched
    assert not same_state(select(r2.params, body), msg.params())
    assert set(r1.momentum) == set(head) and set(r2.momentum) == set(body)
    assert same_state(select(s2.momentum, head), r1.momentum)  # the head's buffers go into the body phase
    assert set(state["momentum"]) == set(head) | set(body)
    assert list(reply.params()) == body and same_state(select(state["params"], head), select(r2.params, head))
    # next round: each phase starts from its own buffers of the previous round
    log2, _, _ = specs_of(sim, 0, msg, state)
    assert same_state(log2[0][0].momentum, state["momentum"])


def test_body_sharing_methods_evaluate_received_body_with_own_head(tiny_fed):
    for spec in ("fedper", "fedrep"):
        sim = tiny_sim(tiny_fed, spec, rounds=2, seed=1)
        sim.run()
        head, body = sim.run_info.model.head_names(), sim.run_info.model.body_names()
        ev, st = eval_message(sim, 2), sim.store.get(2)
        assert "global" not in ev.arrays and list(ev.params()) == body  # no global head: no global model
        p = sim.method.eval_params(ev, st, sim.client_ctx(2, sim.next_round))
        assert same_state(select(p, body), select(sim.server["global"], body))
        assert same_state(select(p, head), select(st["params"], head))
        assert "global_acc" not in sim.history[-1]


def test_fedper_trains_body_and_head_jointly(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedper", rounds=1)
    log, reply, state = specs_of(sim, 0, train_message(sim, 0))
    assert len(log) == 1 and log[0][0].trainable is None
    assert list(reply.params()) == sim.run_info.model.body_names()
    init = sim.run_info.init_params
    assert all(not torch.equal(state["params"][k], init[k]) for k in init)
