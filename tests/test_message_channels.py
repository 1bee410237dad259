"""The message channels are enforced: arrays hold tensors, metrics numbers (or flat lists of them), config is the
server's instructions (numbers, strings, bytes, booleans or flat lists of them) and never goes up; client stats
are numbers. Flower's record types are the rule, so what runs in process also travels over Flower."""

from __future__ import annotations

import pytest
import torch

from fedblend.common.errors import MessageError
from fedblend.core.message import Message, channel_errors
from tests.contract_breakers import ConfigUp, ListStats, NestedMetrics, TensorConfig
from tests.helpers import tiny_sim


def test_a_message_within_the_channels_has_no_errors():
    msg = Message({"params": {"w": torch.zeros(2)}, "extra": {"b": torch.ones(1)}},
                  {"num_samples": 5, "acc": 0.5, "ids": [1, 2], "weights": [0.1, 0.9], "empty": []},
                  {"split": "test", "batch_size": 64, "flag": True, "ids": [3, 4], "blob": b"x"})
    assert channel_errors(msg, reply=False) == []
    assert channel_errors(Message(msg.arrays, msg.metrics), reply=True) == []


@pytest.mark.parametrize("msg, reply, fragment", [
    (Message({"params": {"w": [1.0]}}), False, "arrays['params']['w'] is a list"),
    (Message({"params": torch.zeros(2)}), False, "arrays['params'] is a Tensor"),
    (Message(metrics={"counts": {"0": 3}}), True, "metrics['counts'] is a dict"),
    (Message(metrics={"v": torch.tensor(1.0)}), True, "metrics['v'] is a Tensor"),
    (Message(metrics={"ok": True}), True, "metrics['ok'] is a bool"),
    (Message(metrics={"rows": [[1, 2]]}), True, "metrics['rows'] is a list"),
    (Message(config={"ids": [1]}), True, "a reply carries config ['ids']"),
    (Message(config={"mask": torch.ones(2)}), False, "config['mask'] is a Tensor"),
    (Message(config={"nested": {"a": 1}}), False, "config['nested'] is a dict"),
])
def test_channel_errors_name_each_offending_entry(msg, reply, fragment):
    errors = channel_errors(msg, reply)
    assert len(errors) == 1 and fragment in errors[0]


@pytest.mark.parametrize("method, fragment", [
    (NestedMetrics, "client 0's train reply breaks the message channels:\n  metrics['per_class'] is a dict"),
    (ConfigUp, "a reply carries config ['chosen']"),
    (TensorConfig, "the server's train message to client 0 breaks the message channels:\n  config['mask']"),
    (ListStats, "stats['weights'] is a list"),
])
def test_the_engine_refuses_a_method_that_breaks_the_channels(tiny_fed, method, fragment):
    sim = tiny_sim(tiny_fed, method, rounds=1)
    with pytest.raises(MessageError) as err:
        sim.run_round()
    assert fragment in str(err.value) and str(err.value).startswith(method.name)
