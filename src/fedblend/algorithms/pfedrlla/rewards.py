"""pFedRLLA's pure parts (paper Alg. 1-2, Eq. 1-2): which layers form the head, the body weights, the weighted
mix of models, the similarity target of the agent's action, the reward and the validation score behind it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fedblend.common.params import Params, weighted_average
from fedblend.core.evaluation import evaluate_params
from fedblend.models.zoo import FedModel


def head_layers(model: FedModel, rule: str) -> tuple[str, ...]:
    """``"model"``: the model's own head; ``"fc"``: its trailing run of linear layers (2-D weights), leaving at
    least one layer in the body (the authors' CNN: body = the two conv layers, head = the two fc layers)."""
    if rule == "model":
        return tuple(model.head_layers)
    params = dict(model.named_parameters())
    out: list[str] = []
    for ly in reversed(model.layers[1:]):
        if params.get(f"{ly}.weight") is None or params[f"{ly}.weight"].dim() != 2:
            break
        out.insert(0, ly)
    return tuple(out) or tuple(model.head_layers)


def body_weights(sizes: Sequence[float], rule: str) -> torch.Tensor:
    """Alg. 2 line 1 over ``[K'..., k]`` (``sizes`` in that order): ``rho_i = d_i / sum d``; ``"mean"``: uniform;
    ``"local"``: all weight on ``k`` (the last entry)."""
    d = torch.as_tensor([float(s) for s in sizes], dtype=torch.float64)
    if rule == "size":
        return d / d.sum()
    if rule == "mean":
        return torch.full_like(d, 1.0 / len(d))
    w = torch.zeros_like(d)
    w[-1] = 1.0
    return w


def mix(models: Sequence[Mapping[str, torch.Tensor]], weights: torch.Tensor, names: Sequence[str]) -> Params:
    """``sum_i w_i theta_i`` over the tensors ``names`` (Alg. 2 lines 2 and 5; weights sum to 1)."""
    return weighted_average([{n: m[n] for n in names} for m in models], weights.tolist())


def similarity_target(e_prev: torch.Tensor, e_k: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``V_k = ({d(e_k, e_k')}_k', 1) / (sum_k' d(e_k, e_k') + 1)``, ``d = (cos + 1) / 2``."""
    cos = torch.nn.functional.cosine_similarity(e_prev.double(), e_k.double().unsqueeze(0), dim=1)
    d = torch.cat([(cos + 1) / 2, cos.new_ones(1)])
    return (d / d.sum()).float()


def reward_terms(acc_agg: float, acc_pre: float, action: torch.Tensor, target: torch.Tensor, acc_tar: float,
                 norm: str = "squared") -> tuple[float, float, float]:
    """Eq. 1b-1d: ``r1 = exp(acc_agg - acc_tar) - 1``, ``r2 = acc_agg - acc_pre``, ``r3 = -||A_k - V_k||^2``
    (``norm = "plain"``: ``-||A_k - V_k||``, the authors' code)."""
    dist = float(torch.linalg.vector_norm(action.double() - target.double()))
    return math.exp(acc_agg - acc_tar) - 1.0, acc_agg - acc_pre, -(dist ** 2 if norm == "squared" else dist)


def reward(terms: Sequence[float], beta: Sequence[float]) -> float:
    """Eq. 1a: ``R = sum_i beta_i r_i``."""
    return float(sum(b * r for b, r in zip(beta, terms)))


@torch.no_grad()
def validation_accuracy(model: FedModel, params: Mapping[str, torch.Tensor], data) -> float:
    """Accuracy on the client's validation split (the 65/15/20 split's 15%); a client without one (another
    split mode) scores on its training split."""
    x, y = (data.val_x, data.val_y) if len(data.val_y) else (data.train_x, data.train_y)
    c, _, n = evaluate_params(model, params, x, y)
    return c / n if n else 0.0
