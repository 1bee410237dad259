"""Methods that break the shared contract on purpose, for ``tests/test_shared_suite.py`` (module level, so
worker processes could import them)."""

from __future__ import annotations

from dataclasses import replace

import torch

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.message import Message


class Greedy(FedAvg):
    """Evaluation writes into the client state (it must not)."""

    name = "greedy-test"

    def declare(self, choice):
        return replace(super().declare(choice), keeps_model=True)

    def personalized_params(self, msg, cstate, ctx):
        cstate["evaluated"] = cstate.get("evaluated", 0) + 1
        return super().personalized_params(msg, cstate, ctx)


class Leaky(FedAvg):
    """Replies carry a tensor the method does not declare as shared."""

    name = "leaky-test"

    def reply(self, res, msg, cstate, ctx):
        msg = super().reply(res, msg, cstate, ctx)
        return Message({"params": {**msg.params(), "secret": torch.zeros(1)}}, msg.metrics)


class Noisy(FedAvg):
    """The server draws from torch's global generator (not from its seeded streams): a resumed run differs."""

    name = "noisy-test"

    def aggregate_train(self, server, replies, sctx):
        out = super().aggregate_train(server, replies, sctx)
        return {**out, "global": {k: v + 1e-3 * torch.randn(v.shape) for k, v in out["global"].items()}}


class NestedMetrics(FedAvg):
    """Replies put a dict in metrics (a Flower MetricRecord cannot carry it)."""

    name = "nested-metrics-test"

    def reply(self, res, msg, cstate, ctx):
        msg = super().reply(res, msg, cstate, ctx)
        msg.metrics["per_class"] = {"0": 3}
        return msg


class ConfigUp(FedAvg):
    """Replies carry config (config is downlink only)."""

    name = "config-up-test"

    def reply(self, res, msg, cstate, ctx):
        msg = super().reply(res, msg, cstate, ctx)
        msg.config["chosen"] = [1, 2]
        return msg


class TensorConfig(FedAvg):
    """The server sends a tensor in config (tensors go in arrays)."""

    name = "tensor-config-test"

    def configure_train(self, server, cid, sctx):
        msg = super().configure_train(server, cid, sctx)
        msg.config["mask"] = torch.ones(3)
        return msg


class ListStats(FedAvg):
    """A client stat that is a list (stats are averaged numbers)."""

    name = "list-stats-test"

    def reply(self, res, msg, cstate, ctx):
        ctx.stats["weights"] = [0.5, 0.5]
        return super().reply(res, msg, cstate, ctx)


# ------------------------------------------------------------------ replies that break the reply contract
class ReplyBreaker(FedAvg):
    """FedAvg whose training reply is passed through :meth:`broken` (subclasses break it one way each)."""

    name = "reply-breaker-test"

    def reply(self, res, msg, cstate, ctx):
        return self.broken(super().reply(res, msg, cstate, ctx))

    def broken(self, reply):
        return reply


class NoReply(ReplyBreaker):
    """The reply hook forgot its ``return``."""

    name = "no-reply-test"

    def broken(self, reply):
        return None


class ParamsOnly(ReplyBreaker):
    """The reply hook returns the parameter dict instead of a Message."""

    name = "params-only-test"

    def broken(self, reply):
        return reply.params()


class ShortBias(ReplyBreaker):
    """The last layer's bias uploaded as shape [1] (the model's is [4]): broadcast silently before."""

    name = "short-bias-test"

    def broken(self, reply):
        reply.arrays["params"]["fc2.bias"] = reply.arrays["params"]["fc2.bias"][:1].clone()
        return reply


class Transposed(ReplyBreaker):
    """A weight uploaded transposed (same element count, wrong shape)."""

    name = "transposed-test"

    def broken(self, reply):
        reply.arrays["params"]["fc2.weight"] = reply.arrays["params"]["fc2.weight"].t().contiguous()
        return reply


class IntegerWeights(ReplyBreaker):
    """A parameter uploaded as an integer tensor."""

    name = "integer-weights-test"

    def broken(self, reply):
        reply.arrays["params"]["fc1.bias"] = reply.arrays["params"]["fc1.bias"].round().long()
        return reply


class WrongShapeElsewhere(ReplyBreaker):
    """A tensor under a model parameter's name with the wrong shape, in a record of the method's own."""

    name = "wrong-shape-elsewhere-test"

    def broken(self, reply):
        reply.arrays["extra"] = {"fc1.bias": torch.zeros(3)}
        return reply


class NumSamples(ReplyBreaker):
    """``num_samples`` replaced by :attr:`value`."""

    name = "num-samples-test"
    value = 0

    def broken(self, reply):
        reply.metrics["num_samples"] = self.value
        return reply


class DeclaredExtra(ReplyBreaker):
    """Not a breaker: sends a scalar beside the model in its params record and declares it (extra_entries), and
    a record of its own whose entries are not the model's; both are accepted."""

    name = "declared-extra-test"

    def declare(self, choice):
        return replace(super().declare(choice), extra_entries=("scale",))

    def broken(self, reply):
        reply.arrays["params"]["scale"] = torch.ones(())
        reply.arrays["own"] = {"anything": torch.zeros(7, dtype=torch.long)}
        return reply

    def aggregate_train(self, server, replies, sctx):
        plain = {c: type(r)({"params": {k: v for k, v in r.params().items() if k != "scale"}}, r.metrics)
                 for c, r in replies.items()}
        return super().aggregate_train(server, plain, sctx)
