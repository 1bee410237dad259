"""FedBABU (Oh, Kim and Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022).

"Federated Averaging with Body Aggregation and Body Update" (paper Sec. 4, Alg. 1): the head (``model.
head_layers``) is randomly initialised once and *frozen* for the whole federated training; only the body is
updated by the clients and aggregated by the server:

* the server sends the aggregated body ``theta_ext`` (the head never travels: it is the common initial head
  ``theta_cls^0``, part of the public run facts);
* the client trains the body with the head fixed at ``theta_cls^0`` (Alg. 1: body update), uploads the body;
* the server averages the bodies by data size (FedAvg's rule).

Evaluation (Sec. 4, "personalization"): each client fine-tunes the global model (aggregated body + the initial
head) on its own training data for ``ft_epochs`` (the paper's default: 5 epochs, ``tau_f = 5``) and evaluates
the fine-tuned model; ``ft_part = "all"`` fine-tunes body and head (the paper's default), ``"head"`` only the
head. Fine-tuning reuses FedAvg-FT's mechanism (:class:`~fedblend.algorithms.fedavg_ft.FedAvgFT`: the
``finetune`` random streams, the client's training learning rate and batch size) and is never kept, so it
cannot change training. The global model (aggregated body + initial head) is reported as ``global_accuracy``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from fedblend.algorithms.fedavg_ft import FedAvgFT
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State, Traits
from fedblend.core.template import record_training, train_spec


@dataclass(frozen=True)
class FedBABUOptions:
    CHOICES: ClassVar[dict] = {"ft_part": ("all", "head")}
    RANGES: ClassVar[dict] = {"ft_epochs": "[0, 10000]"}
    ft_epochs: int = opt(5, "tau_f: fine-tuning epochs before evaluation (paper Sec. 4 / 5: 5)")
    ft_part: str = opt("all", '"all": fine-tune body and head (paper); "head": the head only')


@register_method
class FedBABU(FedAvgFT):
    name = "fedbabu"
    display_name = "FedBABU"
    options_cls = FedBABUOptions
    paper = "Oh, Kim and Yun, FedBABU: Toward Enhanced Representation for Federated Image Classification, ICLR 2022"

    def declare(self, choice: str) -> Traits:
        return replace(super().declare(choice), shares="body")

    def eval_models(self) -> dict[str, str]:
        return {"received": "the global model (aggregated body + the frozen initial head), on each client's test "
                            "data"}

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The received body over the initial head ``theta_cls^0`` (from the run facts; it never changes), and
        over the client's own model where a transform keeps one."""
        return {**ctx.run.init_params, **cstate.get("params", {}), **msg.params()}  # the body is always received

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Body update only (Alg. 1): the head stays at its initialisation."""
        res = yield train_spec(self, params, msg, cstate, ctx, trainable=ctx.model.body_names())
        return res, record_training(res, cstate, ctx)

    def finetune_names(self, ctx: ClientCtx) -> list[str] | None:
        return ctx.model.head_names() if self.opts.ft_part == "head" else None
