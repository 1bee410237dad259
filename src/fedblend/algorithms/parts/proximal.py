"""The proximal pull ``mu/2 ||w - anchor||^2`` as a loss term (FedProx Eq. 2; Ditto's personalized objective,
FedAMP's pull to its cloud model u_i)."""

from __future__ import annotations

import torch

from fedblend.common.params import Params
from fedblend.core.training import LossTerm


def proximal_loss(params: Params, batch, anchor: Params, mu: float) -> torch.Tensor:
    """FedProx Eq. 2: ``mu/2 * sum ||w - anchor||^2`` over the anchor's tensors."""
    return 0.5 * mu * sum(((params[k] - v) ** 2).sum() for k, v in anchor.items())


def proximal_term(anchor: Params, mu: float) -> LossTerm:
    """:func:`proximal_loss` as a loss term (its anchor frozen), for any method with a proximal pull."""
    return LossTerm(proximal_loss, {"anchor": {k: v.detach() for k, v in anchor.items()}, "mu": mu}, name="proximal",
                    uses_batch=False)
