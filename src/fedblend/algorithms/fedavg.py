"""FedAvg (McMahan et al. 2017): clients train the received global model; the server averages by data size.

Evaluated as the papers' FedAvg rows are: the global model after aggregation, on each client's test data. A
FedAvg client starts every round from what it receives, so it keeps no model between rounds (a transform that
needs the client's own model, such as ALA, makes it keep one).
"""

from __future__ import annotations

from dataclasses import replace

from fedblend.algorithms.registry import register_method
from fedblend.core.method import Method, Traits


@register_method
class FedAvg(Method):
    name = "fedavg"
    display_name = "FedAvg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, 2017"

    def declare(self, choice: str) -> Traits:
        """Each client starts every round from what it receives, keeps no model, and evaluates that received
        global model: what it would start its next round from."""
        return replace(super().declare(choice), keeps_model=False, evaluates_received_model=True)

    def eval_models(self) -> dict[str, str]:
        return {"received": "the global model after aggregation (what each client receives), on each client's "
                            "test data"}

