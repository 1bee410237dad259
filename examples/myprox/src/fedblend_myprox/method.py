"""FedProx written outside fedblend: the worked example of docs/architecture.md, as a plug-in.

FedProx (Li et al., MLSys 2020) is FedAvg plus one loss term, mu/2 ||w - w^t||^2 (Eq. 2), anchored at the
received global model. The method is the class; the entry point ``myprox`` in ``pyproject.toml`` names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.training import LossTerm


@dataclass(frozen=True)
class MyProxOptions:
    """The ``[options]`` table. ``RANGES`` is checked before a run starts; ``help`` is what ``fedblend methods
    myprox`` shows."""

    RANGES: ClassVar[dict] = {"mu": ">= 0"}
    mu: float = field(default=0.01, metadata={"help": "proximal coefficient mu of FedProx Eq. 2 (0 = FedAvg)"})


def proximal_loss(params, batch, anchor, mu):
    """FedProx Eq. 2: mu/2 ||w - w^t||^2 (module level, so worker processes and batching backends can use it)."""
    return 0.5 * mu * sum(((params[k] - v) ** 2).sum() for k, v in anchor.items())


def proximal_term(anchor, mu) -> LossTerm:
    """The function + its data (batchable, picklable)."""
    return LossTerm(proximal_loss, {"anchor": {k: v.detach() for k, v in anchor.items()}, "mu": mu},
                    name="proximal", uses_batch=False)


class MyProx(FedAvg):
    """FedProx: local SGD on cross-entropy plus a proximal pull to the received global model."""

    name = "myprox"
    options_cls = MyProxOptions
    paper = "Li et al., Federated Optimization in Heterogeneous Networks (FedProx), MLSys 2020 -- example plug-in"

    def loss_terms(self, msg, params, cstate, ctx):
        return (proximal_term(msg.params(), self.opts.mu),) if self.opts.mu else ()
