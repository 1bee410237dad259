"""FedAPA (Sun et al., IJCAI 2025): server-side gradient-based adaptive personalized aggregation.

The server keeps, for every client ``i``, an aggregation-weight vector ``A_i`` over all ``M`` clients (the rows
of an ``M x M`` matrix ``W``) and every client's last uploaded shared parameters ``theta_j``. Per round
(paper Alg. 1), for every joining client ``i``:

* Eq. 5 (line 7):  ``theta_bar_i = sum_j a_ij theta_j``  -- the personalized feature extractor sent to ``i``;
* the client overwrites its body with ``theta_bar_i``, trains body + private head (Eq. 4), uploads ``theta_i``;
* Eq. 6 (line 9):  ``Delta theta_i = theta_i - theta_bar_i``;
* Eq. 7 (line 10): ``A_i <- A_i - eta (grad_{A_i} theta_bar_i)^T Delta theta_i``, where
  ``(grad_{A_i} theta_bar_i)^T v = (<theta_1, v>, ..., <theta_M, v>)`` (inner products over all shared tensors);
* post-processing (Sec. 3.2, lines 11-13): clip every ``a_ij`` to ``[0, 1]``; set ``a_ii = mu``; normalise
  ``A_i`` to sum 1.

Sign of Eq. 7. The paper motivates Eq. 7 as descent on the proxy loss ``1/2 ||theta_bar_i(A_i) - theta_i||^2``
("Eq. 7 updates A_i in a way that minimizes the local loss"), whose gradient is
``(grad_{A_i} theta_bar_i)^T (theta_bar_i - theta_i) = -(grad_{A_i} theta_bar_i)^T Delta theta_i``. Eq. 7 *as
printed*, with ``Delta theta_i = theta_i - theta_bar_i`` (Eq. 6), subtracts ``-gradient``, i.e. it ascends that
loss. The authors' code computes ``grad = (grad theta_bar)^T (theta_bar - theta)`` and takes an optimizer step
``A <- A - eta * grad``: descent. Default ``sign = "descent"`` (stated intent + code); ``sign = "eq7-literal"``
runs Eq. 7 exactly as printed.

Partial model sharing (PMS): only the body (``model.body_names()``, LeNet-5's first four layers) travels; the
head stays in the client state. ``share = "all"`` is the paper's "APA without PMS" ablation (Table 3).

Options that come from the authors' code (``Yuxia-Sun/FedAPA``) rather than the paper, all off by default:
``server_momentum = 0.9`` (their SGD optimizer over the weight matrix), ``momentum_scope = "matrix"`` (one
optimizer for the whole matrix: every step also moves other rows by their stale momentum; rows are then clipped
as a whole and a row's self-weight/normalisation is applied lazily when it is next used, as the code does),
``self_weight_rule = "one"`` (``a_ii <- 1`` before normalising instead of ``mu``), ``sequential = True``
(clients of a round run one after another; later ones see earlier uploads).

Evaluation (paper Sec. 5.2, notes): every client's current local model (received body + private head after its
last training) on its own test data, pooled. There is no global model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.parts.rows import aggregate_row, stack_flat
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import flatten, select, stack_copies, with_rows
from fedblend.core.diagnostics import ClientWeights, RunFiles, register_diagnostics
from fedblend.core.method import Message, Method, ServerCtx, State, Traits
from fedblend.core.template import shared_names


@dataclass(frozen=True)
class FedAPAOptions:
    """FedAPA options; defaults are the paper's (Sec. 3.2, Alg. 1, Sec. 5.1)."""

    CHOICES: ClassVar[dict] = {"self_weight_rule": ("mu", "one"), "sign": ("descent", "eq7-literal"),
                               "momentum_scope": ("row", "matrix"), "share": ("body", "all")}
    RANGES: ClassVar[dict] = {"eta": ">= 0", "mu": ">= 0", "server_momentum": "[0, 1)", "heatmap_rounds": "[1, 1000000]"}

    eta: float = opt(0.01, "server learning rate of the weight vectors (Sec. 5.1)")
    mu: float = opt(0.5, "self-weight set before normalising (Sec. 3.2 step 2, Alg. 1 line 12, Table 4)")
    self_weight_rule: str = opt("mu", "\"mu\": a_ii <- mu (paper); \"one\": a_ii <- 1 (authors' code)")
    clip: bool = opt(True, 'post-processing step 1 (Alg. 1 line 11); False = Table 3 "w/o Clipping"')
    self_weight: bool = opt(True, 'step 2 (line 12); False = "w/o Self-weight"')
    normalize: bool = opt(True, 'step 3 (line 13); False = "w/o Normalization"')
    sign: str = opt("descent", '"descent": minimise 1/2||theta_bar - theta||^2 (text + code); "eq7-literal"')
    server_momentum: float = opt(0.0, "paper: plain step (Eq. 7); authors' code: 0.9")
    momentum_scope: str = opt("row", "\"row\": a row's buffer moves only when it is updated; \"matrix\": authors' code")
    share: str = opt("body", '"body": partial model sharing (paper); "all": Table 3 "APA without PMS"')
    sequential: bool = opt(False, "authors' code: one client after another within a round (paper: parallel)")
    heatmap_rounds: tuple[int, ...] = opt((1, 10, 25, 50), "1-based rounds whose weight matrix is kept for plots")


# ------------------------------------------------------------------------------------------------ pure parts
def weight_gradient(row: torch.Tensor, theta_stack: torch.Tensor, theta_i: torch.Tensor) -> torch.Tensor:
    """Gradient of the proxy loss ``1/2 ||theta_bar_i(A_i) - theta_i||^2`` w.r.t. ``A_i`` (Sec. 3.2).

    ``theta_bar_i = A_i^T Theta`` (Eq. 5, ``Theta`` = ``theta_stack``, rows theta_j), so the Jacobian transpose
    ``(grad_{A_i} theta_bar_i)^T`` is ``Theta`` and the gradient is ``Theta (theta_bar_i - theta_i)``
    ``= -(grad_{A_i} theta_bar_i)^T Delta theta_i`` with ``Delta theta_i`` of Eq. 6.
    """
    theta_bar = row.to(torch.float64) @ theta_stack
    return theta_stack @ (theta_bar - theta_i.to(torch.float64))


def prepare_row(row: torch.Tensor, cid: int, opts: FedAPAOptions) -> torch.Tensor:
    """Steps 2-3 of the post-processing (Alg. 1 lines 12-13): self-weight, then normalisation.

    A row whose sum is not positive (e.g. ``mu = 0`` with every other weight clipped to 0) cannot be
    normalised; it falls back to the client's own model (``a_ii = 1``, others 0).
    """
    row = row.clone()
    if opts.self_weight:
        row[cid] = opts.mu if opts.self_weight_rule == "mu" else 1.0
    if opts.normalize:
        total = row.sum()
        if float(total) <= 0:
            row = torch.zeros_like(row)
            row[cid] = 1.0
        else:
            row = row / total
    return row


def postprocess_row(row: torch.Tensor, cid: int, opts: FedAPAOptions) -> torch.Tensor:
    """Post-processing after the gradient step (Sec. 3.2, Alg. 1 lines 11-13): clip to [0, 1], a_ii, normalise."""
    if opts.clip:
        row = row.clamp(0.0, 1.0)
    return prepare_row(row, cid, opts)


def update_rows(weights: torch.Tensor, momentum: torch.Tensor | None, grads: Mapping[int, torch.Tensor],
                used_rows: Mapping[int, torch.Tensor], opts: FedAPAOptions
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eq. 7 + post-processing for every client in ``grads`` (in client-id order); other rows stay as they were
    (except with ``momentum_scope = "matrix"``, the authors' single optimizer over the whole matrix).

    ``grads[i]`` is :func:`weight_gradient`, ``used_rows[i]`` the row ``A_i`` that built what client ``i`` got.
    Returns new tensors (inputs are not modified).
    """
    w = weights.clone()
    buf = None if momentum is None else momentum.clone()
    sgn = 1.0 if opts.sign == "descent" else -1.0  # eq7-literal: A - eta * (grad theta_bar)^T Delta = A + eta*g
    for cid in sorted(grads):
        g = sgn * grads[cid]
        if opts.momentum_scope == "row":
            row = used_rows[cid]
            if buf is not None:
                buf[cid] = opts.server_momentum * buf[cid] + g
                g = buf[cid]
            w[cid] = postprocess_row(row - opts.eta * g, cid, opts)
        else:  # authors' code: one SGD(momentum) optimizer over W, clamp all of W, self-weight/normalise lazily
            w[cid] = used_rows[cid]
            full = torch.zeros_like(w)
            full[cid] = g
            if buf is not None:
                buf = opts.server_momentum * buf + full
                full = buf
            w = w - opts.eta * full
            if opts.clip:
                w = w.clamp(0.0, 1.0)
    return w, buf


def weight_matrices(run: RunFiles) -> list[ClientWeights]:
    """``fedblend report --diagnostics``: the aggregation weights ``a_ij`` (Eq. 5; row i builds client i's
    model) at each round ``heatmap_rounds`` kept, and after the checkpoint's last round."""
    if not run.has_checkpoint():
        return []
    ck = run.checkpoint()
    server = ck["server"]
    kept = [ClientWeights(f"fedapa_weights_round{r:04d}", f"FedAPA aggregation weights, round {r}", w)
            for r, w in sorted(server.get("snapshots", {}).items())]
    return kept + [ClientWeights("fedapa_weights_latest", f"FedAPA aggregation weights after round "
                                 f"{ck['next_round']}", run.method.effective_weights(server))]


# ------------------------------------------------------------------------------------------------ the method
@register_method
@register_diagnostics(weight_matrices)
class FedAPA(Method):
    name = "fedapa"
    display_name = "FedAPA"
    options_cls = FedAPAOptions
    paper = ("Sun et al., FedAPA: Server-side Gradient-Based Adaptive Personalized Aggregation for Federated "
             "Learning on Heterogeneous Data, IJCAI 2025")
    def declare(self, choice: str) -> Traits:
        """No global model (what travels is the ``share`` option's, :meth:`shared_names`); a client evaluates its
        own current model (Sec. 5.2); ``sequential`` runs a round's clients one by one (the authors' code)."""
        return Traits(global_model=False, evaluates_own_model=True, sequential_server=self.opts.sequential,
                      shares=self.opts.share)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's current local model (last received personalized body + private head, "
                           "after its last local training)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """Alg. 1 lines 1-2: every stored theta_j is the common initial model; ``a_ii = 1``, ``a_ij = 0`` (Sec. 3.2)."""
        m = sctx.run.num_clients
        server: State = {
            "weights": torch.eye(m, dtype=torch.float64, device=sctx.run.device),
            "thetas": stack_copies(select(sctx.run.init_params, shared_names(self, sctx.run)), m),
            "snapshots": {},
        }
        if self.opts.server_momentum > 0:
            server["momentum"] = torch.zeros_like(server["weights"])
        return server

    def row_used(self, server: State, cid: int) -> torch.Tensor:
        """The row ``A_i`` that aggregates client ``i``'s model now (rows are stored post-processed, except with
        the authors' lazy ``momentum_scope = "matrix"``, where self-weight + normalisation happen at use)."""
        row = server["weights"][cid]
        return prepare_row(row, cid, self.opts) if self.opts.momentum_scope == "matrix" else row

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """Alg. 1 line 7 / Eq. 5: the personalized shared parameters for client ``cid``."""
        return Message({"params": aggregate_row(self.row_used(server, cid), server["thetas"])})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Alg. 1 lines 9-13 for every uploading client; then store the uploads (theta_j of later rounds).

        All gradients use the stored parameters and rows from which the round's downlinks were built.
        """
        thetas = server["thetas"]
        stack = stack_flat(thetas)
        uploads = {cid: r.params() for cid, r in replies.items()}
        used = {cid: self.row_used(server, cid) for cid in uploads}
        grads = {}
        for cid, up in uploads.items():
            grads[cid] = weight_gradient(used[cid], stack, flatten(select(up, thetas), torch.float64))
        weights, momentum = update_rows(server["weights"], server.get("momentum"), grads, used, self.opts)
        out = {**server, "weights": weights, "thetas": with_rows(thetas, uploads)}
        if momentum is not None:
            out["momentum"] = momentum
        rnd = sctx.rnd + 1
        if rnd in self.opts.heatmap_rounds:
            out["snapshots"] = {**server.get("snapshots", {}), rnd: self.effective_weights(out).float()}
        return out

    def effective_weights(self, server: State) -> torch.Tensor:
        """The ``M x M`` matrix whose row ``i`` would aggregate client ``i``'s next personalized model."""
        return torch.stack([self.row_used(server, i) for i in range(server["weights"].shape[0])])
