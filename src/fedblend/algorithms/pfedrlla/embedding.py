"""Model embeddings for pFedRLLA's agent state (paper Sec. 3.1, App. D-E, Fig. 6; notes "pFedRLLA").

``kind = "mhae"`` -- the multi-head auto-encoder as the authors code it:

1. one "head" per layer of the model's head: the layer's weight matrix (bias appended as a column, shape
   ``m x (n+1)``) is reduced to a fixed ``f x f`` factor (``f = 32``) by a low-rank projection
   ``F = L M R`` (``L``: ``f x m``, ``R``: ``(n+1) x f``). The authors' module for this step is missing from their
   code (notes); the notes call it a low-rank PCA. A per-model PCA basis differs between clients (signs,
   rotations), so embeddings of different clients would not be comparable; we use one fixed random
   (Johnson-Lindenstrauss) projection per layer, drawn once from the run's seed tree and kept in the state, which
   preserves distances between clients' layers;
2. an LSTM auto-encoder over the sequence of layer factors (``f*f = 1024`` inputs per step): a 2-layer LSTM
   encoder with ``dim = 128`` hidden units, the embedding is the sum of its outputs over the sequence (notes); a
   2-layer LSTM decoder fed the embedding at every step plus a linear read-out reconstructs the factors; the loss
   is the MSE reconstruction error, minimised with Adam (lr 5e-3).

``kind = "flat"``: the same per-layer factors, concatenated, through a plain MLP auto-encoder
(``L*f*f -> 256 -> dim -> 256 -> L*f*f``): what the LSTM over the layer sequence adds.

``kind = "pca"``: the paper's Fig. 6 comparison: the head's parameters flattened and concatenated, projected on
the principal directions of the set of models embedded together (one round's decision set), padded to ``dim``.
No training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fedblend.algorithms.parts.nets import lstm, lstm_init, mlp, mlp_init
from fedblend.core.optim import adam_init, minimise

KINDS = ("mhae", "pca", "flat")


@dataclass(frozen=True)
class EmbedConfig:
    kind: str = "mhae"
    dim: int = 128
    factor: int = 32
    lr: float = 5e-3
    layers: int = 2


def layer_matrices(params: Mapping[str, torch.Tensor], groups: Sequence[Sequence[str]]) -> list[torch.Tensor]:
    """One ``m x (n+1)`` matrix per layer: the weight reshaped to ``(out, -1)`` with the bias as last column."""
    mats = []
    for names in groups:
        w = [params[n] for n in names if params[n].dim() > 1]
        b = [params[n].reshape(-1, 1) for n in names if params[n].dim() == 1]
        rows = w[0].shape[0] if w else b[0].shape[0]
        mats.append(torch.cat([t.reshape(rows, -1).float() for t in w] + [t.float() for t in b], dim=1))
    return mats


def init_embedder(shapes: Sequence[tuple[int, int]], gen: torch.Generator, cfg: EmbedConfig) -> dict:
    """Projections (for ``mhae`` / ``flat``) and the auto-encoder's weights and Adam state."""
    f, d, n_layers = cfg.factor, cfg.dim, len(shapes)
    state: dict = {"kind": cfg.kind, "dim": d, "factor": f, "shapes": [list(s) for s in shapes], "trained_steps": 0}
    if cfg.kind == "pca":
        return state
    state["proj"] = [{"left": torch.randn(f, m, generator=gen) / m ** 0.5,
                      "right": torch.randn(n, f, generator=gen) / n ** 0.5} for m, n in shapes]
    if cfg.kind == "mhae":
        net = {**lstm_init(f * f, d, cfg.layers, gen, "enc"), **lstm_init(d, d, cfg.layers, gen, "dec"),
               **{f"out.{k}": v for k, v in mlp_init([d, f * f], gen).items()}}
    else:
        net = {**{f"enc.{k}": v for k, v in mlp_init([n_layers * f * f, 256, d], gen).items()},
               **{f"dec.{k}": v for k, v in mlp_init([d, 256, n_layers * f * f], gen).items()}}
    state["net"], state["opt"] = net, adam_init(net)
    return state


def signature(emb: Mapping) -> tuple:
    """What must match for an embedding network to serve another run: kind, sizes, the head layers' shapes."""
    return emb["kind"], int(emb["dim"]), int(emb["factor"]), [tuple(int(x) for x in s) for s in emb["shapes"]]


def _part(net: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) + 1 :]: v for k, v in net.items() if k.startswith(prefix + ".")}


def project(emb: Mapping, mats_per_model: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """``(B, L, f*f)``: every model's per-layer factors ``F = L M R`` (the "multi-head" step)."""
    rows = []
    for mats in mats_per_model:
        rows.append(torch.stack([(p["left"] @ m @ p["right"]).reshape(-1) for p, m in zip(emb["proj"], mats)]))
    return torch.stack(rows)


def encode(emb: Mapping, x: torch.Tensor, net: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Embeddings ``(B, dim)`` of projected models ``x`` (``(B, L, f*f)``)."""
    net = emb["net"] if net is None else net
    if emb["kind"] == "mhae":
        return lstm(net, x, "enc").sum(dim=1)
    return mlp(_part(net, "enc"), x.flatten(1))


def decode(emb: Mapping, z: torch.Tensor, steps: int, net: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if emb["kind"] == "mhae":
        h = lstm(net, z.unsqueeze(1).expand(-1, steps, -1), "dec")
        return mlp(_part(net, "out"), h)
    return mlp(_part(net, "dec"), z).reshape(z.shape[0], steps, -1)


def reconstruction_loss(emb: Mapping, x: torch.Tensor, net: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    net = emb["net"] if net is None else net
    return ((decode(emb, encode(emb, x, net), x.shape[1], net) - x) ** 2).mean()


def train(emb: dict, x: torch.Tensor, steps: int, lr: float) -> tuple[dict, float]:
    """``steps`` Adam steps on the MSE reconstruction loss of the projected models ``x`` (App. D-E)."""
    if emb["kind"] == "pca" or steps <= 0:
        return emb, float("nan")
    net, opt, loss = emb["net"], emb["opt"], float("nan")
    for _ in range(steps):
        net, opt, loss = minimise(net, opt, lr, lambda n: reconstruction_loss(emb, x, n))
    return {**emb, "net": net, "opt": opt, "trained_steps": int(emb["trained_steps"]) + steps}, loss


def pca_embed(flat: torch.Tensor, dim: int) -> torch.Tensor:
    """Scores of the rows of ``flat`` (``B x P``) on their principal directions, padded / cut to ``dim``.

    Each direction's sign is fixed (its largest-magnitude entry is positive) so equal inputs give equal outputs.
    """
    x = flat.double() - flat.double().mean(0, keepdim=True)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    sign = torch.sign(vh.gather(1, vh.abs().argmax(1, keepdim=True))).squeeze(1)
    sign[sign == 0] = 1.0
    scores = (u * s * sign).float()
    out = torch.zeros(flat.shape[0], dim, device=flat.device)
    k = min(dim, scores.shape[1])
    out[:, :k] = scores[:, :k]
    return out


@torch.no_grad()
def embed(emb: Mapping, mats_per_model: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """Embeddings ``(B, dim)`` of a set of models, given as their per-layer matrices (:func:`layer_matrices`)."""
    if emb["kind"] == "pca":
        dim = int(emb.get("dim", 128))
        return pca_embed(torch.stack([torch.cat([m.reshape(-1) for m in mats]) for mats in mats_per_model]), dim)
    return encode(emb, project(emb, mats_per_model))
