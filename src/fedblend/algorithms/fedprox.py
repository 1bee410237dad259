"""FedProx (Li et al. 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2 in the client loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State
from fedblend.core.training import LossTerm


@dataclass(frozen=True)
class FedProxOptions:
    RANGES: ClassVar[dict] = {"mu": ">= 0"}
    mu: float = 0.01  # proximal coefficient (FedALA appendix: 0.001 on MNIST-like, tuned per dataset)


def proximal_loss(params: Params, batch, anchor: Params, mu: float) -> torch.Tensor:
    """FedProx Eq. 2: ``mu/2 * sum ||w - anchor||^2`` over the anchor's tensors."""
    return 0.5 * mu * sum(((params[k] - v) ** 2).sum() for k, v in anchor.items())


def proximal_term(anchor: Params, mu: float) -> LossTerm:
    """:func:`proximal_loss` as a loss term (its anchor frozen), for any method with a proximal pull."""
    return LossTerm(proximal_loss, {"anchor": {k: v.detach() for k, v in anchor.items()}, "mu": mu}, name="proximal",
                    uses_batch=False)


@register_method
class FedProx(FedAvg):
    name = "fedprox"
    options_cls = FedProxOptions
    paper = "Li et al., Federated Optimization in Heterogeneous Networks (FedProx), MLSys 2020"

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        """The proximal pull to the received global model ``w^t`` (FedProx Eq. 2)."""
        return (proximal_term(msg.params(), self.opts.mu),) if self.opts.mu else ()
