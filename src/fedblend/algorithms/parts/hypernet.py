"""Server-side hypernetworks as data (pFedHN, pFedLA): a network is a flat ``dict[str, Tensor]`` applied by pure
functions (:mod:`fedblend.algorithms.parts.nets`), trained with the vector-Jacobian product of its output and the
difference a client sends back (pFedHN Alg. 1, pFedLA Alg. 1):

    grad_phi = (d out / d phi)^T (out - trained)

i.e. the gradient of ``1/2 ||out(phi) - trained||^2`` with ``trained`` held fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

Net = dict[str, torch.Tensor]


def part(net: Mapping[str, torch.Tensor], prefix: str) -> Net:
    """The entries of ``net`` under ``prefix + "."``, with the prefix removed."""
    p = prefix + "."
    return {k[len(p):]: v for k, v in net.items() if k.startswith(p)}


def vjp(net: Mapping[str, torch.Tensor], fn: Callable[[Net], Mapping[str, torch.Tensor]],
        cotangent: Mapping[str, torch.Tensor]) -> Net:
    """``(d fn(net) / d net)^T cotangent`` for every entry of ``net`` (zeros where ``fn`` does not use it); only
    the outputs named in ``cotangent`` contribute."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in net.items()}  # (no copy: autograd reads them)
    out = fn(leaves)
    names = [k for k in cotangent if k in out]
    grads = torch.autograd.grad([out[k] for k in names], list(leaves.values()),
                                grad_outputs=[cotangent[k].to(out[k].dtype) for k in names], allow_unused=True)
    return {k: (torch.zeros_like(v) if g is None else g.detach()) for (k, v), g in zip(leaves.items(), grads)}


def proxy_cotangent(generated: Mapping[str, torch.Tensor], trained: Mapping[str, torch.Tensor], sign: str = "descent"
                    ) -> Net:
    """``generated - trained`` (``"descent"``: descent on ``1/2 ||generated - trained||^2``, pFedHN's official code)
    or ``trained - generated`` (``"literal"``: ``Delta theta = trained - generated`` put into the update as is)."""
    s = 1.0 if sign == "descent" else -1.0
    return {k: s * (generated[k].detach() - trained[k].detach().to(generated[k].dtype)) for k in trained}
