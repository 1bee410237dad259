"""Per-client tables on the server: every client's parameters stacked on a leading client axis
(``{name: (M, *shape)}``; built with :func:`fedblend.common.params.stack_copies`, updated with
:func:`~fedblend.common.params.with_rows`), and models built from a row of weights over them (FedAPA Eq. 5,
FedAMP's cloud models u_i, APPLE's mixture Eq. 2, pFedLA's layer-wise aggregates)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedblend.common.params import Params


def stack_flat(thetas: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``{name: (M, *shape)}`` -> ``(M, P)`` float64 matrix whose row ``j`` is client ``j``'s flat theta_j."""
    return torch.cat([t.reshape(t.shape[0], -1).to(torch.float64) for t in thetas.values()], dim=1)


def aggregate_row(row: torch.Tensor, thetas: Mapping[str, torch.Tensor]) -> Params:
    """``theta_bar_i = sum_j a_ij theta_j`` for every stacked tensor (computed in float64, FedAPA Eq. 5)."""
    out: Params = {}
    for name, t in thetas.items():
        shape = (-1,) + (1,) * (t.dim() - 1)
        out[name] = (t.to(torch.float64) * row.to(torch.float64).view(shape)).sum(0).to(t.dtype)
    return out
