"""Interpolation of parameter dictionaries: ``w * a + (1 - w) * b``, the blend under ALA (Eq. 4), APFL's mixture
(Eq. 3), FedALP's layer mix (Eq. 9-10), FedPHP's historical moving average, pFedMe's server step (Alg. 1 line 11)
and DDPG's soft target update."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

Params = dict[str, torch.Tensor]


def lerp(a: torch.Tensor, b: torch.Tensor, w: float | torch.Tensor) -> torch.Tensor:
    """``w * a + (1 - w) * b`` (``w``: a number or a tensor broadcast against ``a``)."""
    return w * a + (1 - w) * b


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                w: float | torch.Tensor | Mapping[str, torch.Tensor], names: Iterable[str] | None = None) -> Params:
    """:func:`lerp` per tensor over ``names`` (default: ``a``'s, in its order); ``w`` is one weight for every
    tensor or a dict of per-tensor weights (ALA's element-wise ``W``)."""
    names = list(a) if names is None else names
    if isinstance(w, Mapping):
        return {k: lerp(a[k], b[k], w[k]) for k in names}
    return {k: lerp(a[k], b[k], w) for k in names}
