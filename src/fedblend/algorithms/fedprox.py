"""FedProx (Li et al. 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2 in the client loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.parts.proximal import proximal_term
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State
from fedblend.core.training import LossTerm


@dataclass(frozen=True)
class FedProxOptions:
    RANGES: ClassVar[dict] = {"mu": ">= 0"}
    mu: float = opt(0.01, "proximal coefficient (FedALA appendix: 0.001 on MNIST-like, tuned per dataset)")


@register_method
class FedProx(FedAvg):
    name = "fedprox"
    display_name = "FedProx"
    options_cls = FedProxOptions
    paper = "Li et al., Federated Optimization in Heterogeneous Networks (FedProx), MLSys 2020"

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        """The proximal pull to the received global model ``w^t`` (FedProx Eq. 2)."""
        return (proximal_term(msg.params(), self.opts.mu),) if self.opts.mu else ()
