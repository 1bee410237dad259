"""FedALA (Zhang et al., AAAI 2023, Alg. 1): FedAvg whose clients initialise by Adaptive Local Aggregation.

``fedala`` is exactly ``fedavg+ala``: the server is FedAvg's (Alg. 1 line 21: data-size-weighted mean of the
uploads), each selected client runs ALA (:mod:`fedblend.algorithms.ala`, Eq. 4-5) before local training. Its
options are ALA's, given in the ``[options]`` table (``fedavg+ala`` takes the same fields in ``[ala]``).
"""

from __future__ import annotations

from typing import Any

from fedblend.algorithms.ala import ALA, ALAOptions
from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.registry import register_method
from fedblend.core.method import ClientTransform


@register_method
class FedALA(FedAvg):
    name = "fedala"
    display_name = "FedALA"
    options_cls = ALAOptions
    paper = "Zhang et al., FedALA: Adaptive Local Aggregation for Personalized Federated Learning, AAAI 2023"

    def eval_models(self) -> dict[str, str]:
        return {"received": "the ALA-initialised model of each client (see the ALA transform)"}

    def __init__(self, options: Any = None, transforms: list[ClientTransform] | None = None):
        if any(isinstance(t, ALA) for t in transforms or []):
            raise ValueError("fedala already runs ALA; use 'fedala' or 'fedavg+ala', not 'fedala+ala'")
        options = options if options is not None else self.options_cls()
        super().__init__(options, [ALA(options)] + list(transforms or []))

    @property
    def label(self) -> str:
        return "+".join([self.name] + [t.name for t in self.transforms[1:]])
