"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", arXiv:1912.00818, 2019).

The network is split into base layers ``W_B`` (the body, ``model.body_names()``) and personalization layers
``W_P`` (the head, ``model.head_layers``). Per round (paper Sec. 3, Algorithm 1):

* the server sends the aggregated base layers ``W_B`` to every selected client (the head never travels);
* client ``j`` sets its base layers to ``W_B`` and keeps its own ``W_P^j``, then trains base and
  personalization layers *jointly* with SGD for the configured local epochs;
* it uploads only ``W_B^j``; the server averages them by data size (FedAvg's rule).

Evaluation: each client's model as it would start the next round, i.e. the aggregated base layers with the
client's own personalization layers after its last local training (the paper evaluates "the personalized
models" ``(W_B, W_P^j)``; it does not say whether before or after a last local step). There is no global
model: the head is never aggregated, so ``global_accuracy`` is not reported (``global_params`` is None); the
server still keeps a ``global`` body (and the initial head, unused) so ``+ala`` has a received model to blend.
"""

from __future__ import annotations

from dataclasses import replace

from fedblend.algorithms.registry import register_method
from fedblend.core.method import Method, Traits


class BodySharing(Method):
    """The part FedPer and FedRep have in common: only the body travels, the head stays in the client state,
    the personalized model is the received body over the client's own head."""

    def declare(self, choice: str) -> Traits:
        """The body travels; the server's global body (with the initial head) is what clients train from, but
        the head is never aggregated, so no global accuracy is reported; the personalized model is the received
        (aggregated) body over the client's own head, its start of the next round."""
        return replace(super().declare(choice), shares="body", reports_global=False, evaluates_received_model=True)

    def eval_models(self) -> dict[str, str]:
        return {"received": "each client's aggregated body (what it receives) with its own head after its last "
                            "local training"}


@register_method
class FedPer(BodySharing):
    name = "fedper"
    display_name = "FedPer"
    paper = "Arivazhagan et al., Federated Learning with Personalization Layers, arXiv:1912.00818, 2019"
