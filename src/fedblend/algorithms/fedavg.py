"""FedAvg (McMahan et al. 2017): clients train the received global model; the server averages by data size.

Evaluated as the papers' FedAvg rows are: the global model after aggregation, on each client's test data. A
FedAvg client starts every round from what it receives, so it keeps no model between rounds (a transform that
needs the client's own model, such as ALA, makes it keep one).
"""

from __future__ import annotations

from fedblend.algorithms.registry import register_method
from fedblend.core.method import Method


@register_method
class FedAvg(Method):
    name = "fedavg"
    display_name = "FedAvg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, 2017"
    eval_model = "the global model after aggregation (what each client receives), on each client's test data"
    evaluates_received_model = True  # what the client would start its next round from: the received global model
    client_keeps_model = False

