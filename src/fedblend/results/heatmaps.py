"""Client-to-client weight matrices (a method's :class:`~fedblend.core.diagnostics.ClientWeights`, e.g. FedAPA's
``a_ij``) as pictures and numbers: a heatmap, and how much weight goes to clients that share a class
(``fedblend report --diagnostics``, docs/methods/fedapa.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from fedblend.common.optional import pyplot


def same_class_mass(weights: torch.Tensor, train_counts: Sequence[Sequence[int]]) -> dict[str, float]:
    """How much of each client's weight on *other* clients goes to clients that share a class with it.

    ``shares(i, j)``: clients i and j both hold training samples of at least one common class. Returns the mean
    over clients of ``sum_{j != i, shares} a_ij / sum_{j != i} a_ij`` (clients with no off-diagonal mass are
    left out), the same for a uniform row (the chance level), and the mean self-weight.
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    has = torch.as_tensor(train_counts) > 0
    share = (has.double() @ has.double().T) > 0
    eye = torch.eye(w.shape[0], dtype=torch.bool)
    off = w.masked_fill(eye, 0.0)
    total = off.sum(1)
    ok = total > 0
    mass = (off * share).sum(1)[ok] / total[ok]
    chance = ((share & ~eye).sum(1).double() / (w.shape[0] - 1))[ok]
    return {"same_class_mass": float(mass.mean()) if ok.any() else float("nan"),
            "chance_level": float(chance.mean()) if ok.any() else float("nan"),
            "mean_self_weight": float(w.diagonal().mean())}


def save_heatmap(matrix: torch.Tensor, path: str | Path, title: str = "") -> Path:
    """Write the aggregation-weight matrix (row i = weights client i's model is built from) as a PNG."""
    plt = pyplot("the heatmaps")

    m = matrix.detach().cpu().float().numpy()
    n = m.shape[0]
    fig, ax = plt.subplots(figsize=(1.0 + 0.3 * n, 0.8 + 0.3 * n))
    im = ax.imshow(m, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(m.max())))
    ax.set_xlabel("client j (contributes)")
    ax.set_ylabel("client i (receives)")
    ticks = list(range(0, n, max(1, n // 20)))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="a_ij")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
