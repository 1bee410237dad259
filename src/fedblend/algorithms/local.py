"""Local-only: every client trains its own model on its own data; nothing is communicated."""

from __future__ import annotations

from collections.abc import Mapping

from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params
from fedblend.core.method import Method, Setup, State


@register_method
class Local(Method):
    name = "local"
    paper = "baseline: no federation"
    eval_model = "each client's own model after its last local training"
    has_global = False

    def init_server(self, setup: Setup) -> State:
        return {}

    def downlink(self, server: State, cid: int, setup: Setup) -> Params:
        return {}

    def upload(self, params, cstate, ctx) -> State:
        return {}

    def aggregate(self, server: State, uploads: Mapping[int, State], setup: Setup) -> State:
        return server
