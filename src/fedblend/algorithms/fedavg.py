"""FedAvg (McMahan et al. 2017): clients train the received global model; the server averages by data size.

Evaluated as the papers' FedAvg rows are: the global model after aggregation, on each client's test data.
"""

from __future__ import annotations

from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Method, State


@register_method
class FedAvg(Method):
    name = "fedavg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, 2017"
    eval_model = "the global model after aggregation (what each client receives), on each client's test data"

    def personalized_params(self, server: State, cstate: State, ctx: ClientCtx) -> Params:
        if self.transforms:  # with a client transform the personalized model is the client's own
            return cstate["params"]
        return server["global"]
