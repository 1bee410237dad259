"""Methods that break the shared contract on purpose, for ``tests/test_shared_suite.py`` (module level, so
worker processes could import them)."""

from __future__ import annotations

import torch

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.message import Message


class Greedy(FedAvg):
    """Evaluation writes into the client state (it must not)."""

    name = "greedy-test"
    client_keeps_model = True

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
