"""Every training reply is checked against the reply contract before it is aggregated (fedblend.core.replies):
a Message (a reply hook that returns none is a HookError at that hook, fedblend.core.returns), model parameters
of the model's shapes and a floating dtype, no names the model lacks in a parameter record (beyond what the method
declares), a positive num_samples. A violation is a MessageError naming the method, the client, the round, the
record and the entry -- never an AttributeError, and never a run that "finishes" on a silently broadcast upload.
The contract suite (fedblend.testing) runs the same check, and aggregation refuses shape mismatches outright."""

from __future__ import annotations

import math
import re

import pytest
import torch

from fedblend.common.errors import HookError, MessageError
from fedblend.common.params import weighted_average
from fedblend.core.message import Message
from fedblend.core.replies import reply_errors
from fedblend.testing import check_replies
from tests.contract_breakers import (
    DeclaredExtra,
    IntegerWeights,
    Leaky,
    NoReply,
    NumSamples,
    ParamsOnly,
    ShortBias,
    Transposed,
    WrongShapeElsewhere,
)
from tests.helpers import tiny_sim

MODEL = {"fc.weight": torch.zeros(10, 4), "fc.bias": torch.zeros(10)}


def _num_samples(value):
    return type(f"NumSamples{value!r}", (NumSamples,), {"value": value, "name": "num-samples-test"})


# (breaker, fragment of the message after "<method>: client <c>'s reply in round 1: ")
BREAKERS = [
    (ShortBias, "params['fc2.bias'] has shape [1], the model's is [4]"),
    (Transposed, "params['fc2.weight'] has shape [50, 4], the model's is [4, 50]"),
    (IntegerWeights, "params['fc1.bias'] has dtype torch.int64: model parameters are floating point"),
    (WrongShapeElsewhere, "extra['fc1.bias'] has shape [3], the model's is [50]"),
    (Leaky, "params['secret'] is not a parameter of the model"),
    (_num_samples(0), "metrics['num_samples'] is 0: it must be a positive number"),
    (_num_samples(-3), "metrics['num_samples'] is -3"),
    (_num_samples(math.nan), "metrics['num_samples'] is nan"),
    (_num_samples(math.inf), "metrics['num_samples'] is inf"),
]


#: (breaker, what its reply hook returned): no Message at all is the reply hook's wrong return (core.returns)
NOT_A_MESSAGE = [(NoReply, "None (a missing return?)"), (ParamsOnly, "a dict")]


def _not_a_message(method, got: str) -> str:
    return (rf"^method plug-in '{method.name}' \(tests.contract_breakers:{method.__name__}\): reply returned "
            rf"{re.escape(got)}, not a Message \(client \d, round 1\); a fault of its code$")


class TestTheEngineRefusesABrokenReply:
    """Each way of breaking a reply stops the run in round 1 with a MessageError that names the method, the
    client, the round and the entry; nothing is aggregated."""

    @pytest.mark.parametrize("method, fragment", BREAKERS, ids=lambda x: getattr(x, "__name__", "")[:30])
    def test_named_before_aggregation(self, tiny_fed, method, fragment):
        sim = tiny_sim(tiny_fed, method, rounds=2)
        before = {k: v.clone() for k, v in sim.server["global"].items()}
        with pytest.raises(MessageError) as err:
            sim.run_round()
        text = str(err.value)
        assert text.startswith(f"{method.name}: client ") and "'s reply in round 1: " in text, text
        assert fragment in text, text
        assert all(torch.equal(before[k], v) for k, v in sim.server["global"].items()), "a broken reply aggregated"

    @pytest.mark.parametrize("method, fragment", BREAKERS, ids=lambda x: getattr(x, "__name__", "")[:30])
    def test_the_contract_suite_names_it_too(self, tiny_fed, method, fragment):
        with pytest.raises((AssertionError, MessageError), match="reply in round 1"):
            check_replies(method, tiny_fed)

    @pytest.mark.parametrize("method, got", NOT_A_MESSAGE, ids=["None", "dict"])
    def test_a_reply_that_is_no_message_is_named_at_the_reply_hook(self, tiny_fed, method, got):
        sim = tiny_sim(tiny_fed, method, rounds=2)
        before = {k: v.clone() for k, v in sim.server["global"].items()}
        with pytest.raises(HookError, match=_not_a_message(method, got)):
            sim.run_round()
        assert all(torch.equal(before[k], v) for k, v in sim.server["global"].items()), "a broken reply aggregated"
        with pytest.raises(HookError, match=_not_a_message(method, got)):
            check_replies(method, tiny_fed)


class TestWhatTheContractAccepts:
    """Built-in shapes of replies pass: declared extra entries, records of the method's own, no num_samples."""

    def test_declared_extra_entries_and_own_records_pass(self, tiny_fed):
        sim = tiny_sim(tiny_fed, DeclaredExtra, rounds=2)
        sim.run()
        check_replies(DeclaredExtra, tiny_fed)

    @pytest.mark.parametrize("reply", [
        Message({"params": {"fc.bias": torch.ones(10)}}, {"num_samples": 3}),  # a subset of the model (a body)
        Message({"protos": {"0": torch.ones(5), "1": torch.ones(5)}}, {"num_samples": 2.5}),  # a record of its own
        Message(),  # Local: nothing travels
        Message({"params": {"fc.weight": torch.ones(10, 4, dtype=torch.float16)}}),  # another floating dtype
    ])
    def test_sound_replies_have_no_errors(self, reply):
        assert reply_errors(reply, MODEL) == []

    def test_zero_samples_only_from_a_client_without_training_data(self):
        reply = Message({"params": {"fc.bias": torch.ones(10)}}, {"num_samples": 0})
        assert reply_errors(reply, MODEL, num_train=0) == []
        assert reply_errors(reply, MODEL, num_train=5) and reply_errors(reply, MODEL)


class TestReplyErrorsNameEachEntry:
    """reply_errors gives one line per offending entry, whatever kind of wrong value it is."""

    @pytest.mark.parametrize("reply, fragment", [
        (None, "the reply is None"),
        ({"params": {}}, "the reply is a dict"),
        ((Message(), {}), "the reply is a tuple"),
        (Message({"params": {"fc.bias": torch.ones(1)}}), "params['fc.bias'] has shape [1], the model's is [10]"),
        (Message({"params": {"fc.bias": torch.ones(())}}), "params['fc.bias'] has shape [], the model's is [10]"),
        (Message({"params": {"fc.bias": torch.ones(10, 1)}}), "has shape [10, 1], the model's is [10]"),
        (Message({"params": {"fc.bias": torch.ones(10, dtype=torch.bool)}}), "has dtype torch.bool"),
        (Message({"params": {"fc.bias": torch.ones(10, dtype=torch.int32)}}), "has dtype torch.int32"),
        (Message({"params": {"fc3.bias": torch.ones(10)}}), "params['fc3.bias'] is not a parameter of the model"),
        (Message(metrics={"num_samples": -1}), "metrics['num_samples'] is -1"),
        (Message(metrics={"num_samples": True}), "metrics['num_samples'] is True"),
        (Message(metrics={"num_samples": [3]}), "metrics['num_samples'] is [3]"),
    ])
    def test_one_line_per_entry(self, reply, fragment):
        errors = reply_errors(reply, MODEL)
        assert len(errors) == 1 and fragment in errors[0], errors


class TestAggregationRefusesMismatches:
    """weighted_average refuses models whose names or shapes differ instead of broadcasting or ignoring them."""

    @pytest.mark.parametrize("other, fragment", [
        ({"w": torch.ones(1), "b": torch.ones(2)}, "'w' has shape [1], not [3]"),
        ({"w": torch.ones(3, 1), "b": torch.ones(2)}, "'w' has shape [3, 1], not [3]"),
        ({"w": torch.ones(3)}, "missing ['b']"),
        ({"w": torch.ones(3), "b": torch.ones(2), "c": torch.ones(1)}, "extra ['c']"),
    ])
    def test_named_mismatch(self, other, fragment):
        ref = {"w": torch.zeros(3), "b": torch.zeros(2)}
        with pytest.raises(ValueError, match="model 1 does not match model 0") as err:
            weighted_average([ref, other], [1, 1])
        assert fragment in str(err.value)

    def test_weights_count_must_match(self):
        with pytest.raises(ValueError, match="2 models but 3 weights"):
            weighted_average([{"w": torch.zeros(1)}] * 2, [1, 1, 1])


class TestWorkerProcessesNameItTheSameWay:
    """Under the process backend a reply hook that returns no Message is the same HookError, raised in the main
    process, not a RuntimeError wrapping a worker's traceback."""

    @pytest.mark.parametrize("method, got", NOT_A_MESSAGE, ids=["None", "dict"])
    def test_process_backend(self, tiny_fed, method, got):
        from fedblend.core.backends import ProcessBackend

        with tiny_sim(tiny_fed, method, rounds=1, backend=ProcessBackend(workers=2, threads=1)) as sim:
            with pytest.raises(HookError, match=_not_a_message(method, got)):
                sim.run_round()

    @pytest.mark.parametrize("method, got", NOT_A_MESSAGE, ids=["None", "dict"])
    def test_vmap_backend(self, tiny_fed, method, got):
        """The vmap backend's lock-step driver names it too (the client template runs there as it is)."""
        from fedblend.core.vmap import VmapBackend

        with tiny_sim(tiny_fed, method, rounds=1, backend=VmapBackend()) as sim:
            with pytest.raises(HookError, match=_not_a_message(method, got)):
                sim.run_round()
