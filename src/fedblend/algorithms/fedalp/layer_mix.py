"""FedALP's layer-wise weights and mixing (Xie et al. 2022, Eq. 6-11, Algorithm 1 ``MixByLayer`` line 11 and
Algorithm 2 ``LayersWeight``), as pure functions of parameter dicts:

* :func:`layer_units` -- the units that get one weight each (a model layer, or each tensor);
* :func:`layer_weights` -- ``Psi = beta * delta / max(delta)`` from a group's update (Eq. 6-8);
* :func:`mix_by_layer` -- ``W^(l) = Psi^(l) w_m^(l) + (1 - Psi^(l)) w_g^(l)`` (Eq. 9-10);
* :func:`global_from_groups` -- the global model from the group models (Algorithm 1 line 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedblend.algorithms.parts.mix import lerp
from fedblend.common.params import Params, layer_of, weighted_average


def layer_units(names: Sequence[str], unit: str = "layer") -> dict[str, list[str]]:
    """Parameter names grouped into the units that get one weight each (a model layer, or each tensor)."""
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(layer_of(n) if unit == "layer" else n, []).append(n)
    return out


def layer_weights(update: Mapping[str, torch.Tensor], beta: float, unit: str = "layer") -> dict[str, float]:
    """FedALP Eq. 6-8 / Algorithm 2 ``LayersWeight``: ``Psi = beta * delta / max(delta)``, where ``delta^(l)`` is
    the L2 norm of the (group-averaged) update restricted to unit ``l`` (weight and bias of a layer together).
    A zero update gives ``Psi = 0`` everywhere."""
    units = layer_units(list(update), unit)
    delta = {u: float(torch.sqrt(sum((update[n].double() ** 2).sum() for n in names))) for u, names in units.items()}
    top = max(delta.values(), default=0.0)
    return {u: (beta * d / top if top > 0 else 0.0) for u, d in delta.items()}


def mix_by_layer(group: Mapping[str, torch.Tensor], glob: Mapping[str, torch.Tensor], psi: Mapping[str, float],
                 unit: str = "layer") -> Params:
    """FedALP Eq. 9-10 (Algorithm 1 ``MixByLayer``): ``W^(l) = Psi^(l) w_m^(l) + (1 - Psi^(l)) w_g^(l)``."""
    out: Params = {}
    for n, g in glob.items():
        p = float(psi[layer_of(n) if unit == "layer" else n])
        out[n] = g.clone() if p == 0.0 else (group[n].clone() if p == 1.0 else lerp(group[n], g, p))
    return out


def global_from_groups(groups: Sequence[Mapping[str, torch.Tensor]], shares: Sequence[float]) -> Params:
    """Algorithm 1 line 11: ``w_g = sum_m (sum_{k in G_m} gamma_k) w_m`` (shares normalised to sum 1)."""
    keep = [(g, s) for g, s in zip(groups, shares) if s > 0]
    return weighted_average([g for g, _ in keep], [s for _, s in keep])
