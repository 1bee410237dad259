"""The body's output ``f(x)`` (every model has ``forward(x, part="features")``) over a client's data, in chunks
and without gradients: FedProto's and FedGH's prototypes, FedPAC's feature statistics, DBE's feature mean."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch.func import functional_call

from fedblend.models.zoo import FedModel


@torch.no_grad()
def feature_chunks(model: FedModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                   batch_size: int) -> Iterator[torch.Tensor]:
    """``f(x)`` for consecutive chunks of ``batch_size`` rows of ``x``."""
    for i in range(0, len(x), batch_size):
        yield functional_call(model, dict(params), (x[i : i + batch_size],), {"part": "features"})


@torch.no_grad()
def features_of(model: FedModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                batch_size: int = 2048) -> torch.Tensor:
    """``f(x)`` for every row of ``x``."""
    outs = list(feature_chunks(model, params, x, batch_size))
    return torch.cat(outs) if outs else torch.zeros(0)


@torch.no_grad()
def feature_mean(model: FedModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                 batch_size: int = 1024) -> torch.Tensor:
    """``E f(x)`` over the rows of ``x`` (chunk sums added up, then divided by the row count)."""
    total = None
    for f in feature_chunks(model, params, x, batch_size):
        total = f.sum(0) if total is None else total + f.sum(0)
    return total / max(len(x), 1)
