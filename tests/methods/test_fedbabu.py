"""FedBABU: the head stays frozen during training and is fine-tuned only for evaluation."""

from __future__ import annotations

import pytest

from fedblend.common.params import num_bytes, select
from tests.helpers import eval_message, run_client, same_state, tiny_sim, train_message

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedbabu_head_stays_at_its_initialisation(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedbabu+ala", rounds=4, seed=2, momentum=0.9, weight_decay=0.1,
                   optimizer_state="keep")
    sim.run()
    init = sim.run_info.init_params
    head, body = sim.run_info.model.head_names(), sim.run_info.model.body_names()
    assert same_state(select(sim.server["global"], head), select(init, head))
    assert not same_state(select(sim.server["global"], body), select(init, body))
    for st in sim.store.states.values():
        assert same_state(select(st["params"], head), select(init, head))
        assert set(st["momentum"]) == set(body)  # no optimizer state for the frozen head


def test_fedbabu_sends_the_body_only_and_fine_tunes_at_evaluation(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedbabu", rounds=2, seed=2)
    sim.run_round()
    body, head = sim.run_info.model.body_names(), sim.run_info.model.head_names()
    msg = train_message(sim, 0)
    res = run_client(sim, 0, msg)
    assert list(msg.params()) == body and list(res.reply.params()) == body
    assert res.reply.num_bytes == num_bytes(select(sim.run_info.init_params, body)) < num_bytes(sim.run_info.init_params)
    ev, ctx = eval_message(sim, 0), sim.client_ctx(0, sim.next_round)
    tuned = sim.method.eval_params(ev, sim.store.get(0), ctx)
    assert not same_state(select(tuned, head), select(sim.run_info.init_params, head))  # ft_part "all"
    head_only = tiny_sim(tiny_fed, "fedbabu", {"ft_part": "head", "ft_epochs": 2}, rounds=2, seed=2)
    head_only.run_round()
    tuned = head_only.method.eval_params(eval_message(head_only, 0), head_only.store.get(0), ctx)
    assert same_state(select(tuned, body), select(head_only.server["global"], body))
    assert not same_state(select(tuned, head), select(head_only.server["global"], head))
    none = tiny_sim(tiny_fed, "fedbabu", {"ft_epochs": 0}, rounds=2, seed=2)
    none.run_round()
    assert same_state(none.method.eval_params(eval_message(none, 0), none.store.get(0), ctx), none.server["global"])
