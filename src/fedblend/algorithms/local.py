"""Local-only: every client trains its own model on its own data; nothing is communicated."""

from __future__ import annotations

from collections.abc import Mapping

from fedblend.algorithms.registry import register_method
from fedblend.core.method import ClientCtx, Message, Method, ServerCtx, State, Traits


@register_method
class Local(Method):
    name = "local"
    display_name = "Local"
    paper = "baseline: no federation"

    def declare(self, choice: str) -> Traits:
        return Traits(global_model=False)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's own model after its last local training"}

    def init_server(self, sctx: ServerCtx) -> State:
        return {}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message()

    def reply(self, res, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        return Message()

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        return server
