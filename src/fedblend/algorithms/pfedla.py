"""pFedLA (Ma, Zhang, Guo, Xu, "Layer-wised Model Aggregation for Personalized Federated Learning", CVPR 2022).

The server stores every client's latest model ``theta_j`` and, per client ``i``, a hypernetwork
``HN_i(v_i; phi_i)`` (embedding ``v_i``, an MLP trunk, one linear head per layer ``l``) whose output is the
layer-wise aggregation-weight matrix ``alpha_i`` (``L x N``). Per round, for every joining client ``i``:

* personalized model, layer by layer: ``theta-bar_i^l = sum_j alpha_i^{l,j} theta_j^l``, with
  ``alpha_i^l = relu(W_l z_i + b_l) / sum_j relu(...)`` (``z_i`` the trunk's output; a layer whose weights are all
  zero falls back to the client's own model, as FL-bench);
* the client trains ``theta-bar_i`` and sends back ``theta_i``; the server stores it as the new ``theta_i``;
* the hypernetwork is updated through the chain rule:
  ``phi_i <- phi_i - eta (grad_{phi_i} alpha_i)^T (grad_{alpha_i} theta-bar_i)^T d_i`` -- the vector-Jacobian
  product of the whole map ``phi_i -> theta-bar_i`` with ``d_i`` (:func:`fedblend.algorithms.parts.hypernet.vjp`).

The sign of ``d_i`` (``sign``): ``"descent"`` (default) ``d_i = theta-bar_i - theta_i``, descent on
``1/2 ||theta-bar_i(phi_i) - theta_i||^2`` -- the aggregate moves towards what the client learned, the same rule as
pFedHN and FedAPA's default. ``"literal"``: ``d_i = theta_i - theta-bar_i`` (``Delta theta_i`` put into the
update as written, which is what FL-bench's ``grad_outputs = -(old - new)`` does); it ascends that proxy.

Layers are the model's layers (weight and bias of a layer share a weight, ``granularity = "layer"``, the paper);
``"tensor"`` gives every parameter tensor its own weights (FL-bench). Hypernetwork sizes and the optimiser
(SGD, lr 5e-3, no momentum, embedding and hidden dim 100, heads initialised uniform [0, 1) with zero bias) follow
FL-bench, which the paper's public code became. Not implemented: HeurpFedLA (the top-k heuristic).

There is no global model. The personalized model evaluated (``[eval] model``) is by default (``"trained"``)
``theta_i``, the client's model
after its last local training as the server stores it (FL-bench's evaluation, and what fedblend's other methods
that keep a model per client score); ``"received"``: ``theta-bar_i`` built now (what the client would receive; the
unofficial KarhouTam/pFedLA). At the default ``hn_lr`` the weights stay within a few thousandths of their near
uniform start over 50 rounds, so ``theta-bar_i`` is close to a plain average of the clients' models
(docs/methods/pfedla.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.parts.hypernet import part, proxy_cotangent, vjp
from fedblend.algorithms.parts.nets import mlp, mlp_init
from fedblend.algorithms.parts.rows import aggregate_row
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, layer_of, stack_copies, with_rows
from fedblend.common.rng import SeedTree
from fedblend.core.method import Message, Method, RunInfo, ServerCtx, State, Traits
from fedblend.core.optim import sgd_init, sgd_step


@dataclass(frozen=True)
class PFedLAOptions:
    """Defaults: FL-bench's pFedLA (the paper's sizes and rates where it gives them)."""

    CHOICES: ClassVar[dict] = {"sign": ("descent", "literal"), "granularity": ("layer", "tensor")}
    RANGES: ClassVar[dict] = {"embed_dim": "[1, 4096]", "hidden": "[1, 4096]", "hn_lr": "> 0", "hn_momentum": "[0, 1)"}

    embed_dim: int = opt(100, "size of each client's embedding (FL-bench: 100)")
    hidden: int = opt(100, "width of the hypernetwork's hidden layer (FL-bench: 100)")
    hn_lr: float = opt(5e-3, "learning rate eta of the hypernetwork update (FL-bench: 5e-3)")
    hn_momentum: float = opt(0.0, "SGD momentum of the hypernetwork update (FL-bench: none)")
    sign: str = opt("descent", '"descent": d_i = theta-bar_i - theta_i (towards what the client learned); "literal": '
                              "d_i = theta_i - theta-bar_i as written (FL-bench), which ascends that proxy")
    granularity: str = opt("layer", '"layer": weight and bias of a layer share a weight (paper); "tensor": every '
                                    "parameter tensor its own (FL-bench)")
    sequential: bool = opt(False, "True: one client after another (FL-bench): later clients see earlier uploads")


# ------------------------------------------------------------------------------------------------ pure parts
def groups(names: Sequence[str], granularity: str) -> list[list[str]]:
    """The parameter tensors sharing one weight vector: per layer (``layer_of``) or per tensor, in order."""
    if granularity == "tensor":
        return [[n] for n in names]
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(layer_of(n), []).append(n)
    return list(out.values())


def init_hypernet(num_groups: int, num_clients: int, opts: PFedLAOptions, gen: torch.Generator) -> dict:
    """One client's hypernetwork (FL-bench's initialisation): embedding ``N(0, 1)``, 3-layer ReLU trunk, heads
    ``hidden -> N`` with weights uniform in [0, 1) and zero bias."""
    net = {"embed": torch.randn(opts.embed_dim, generator=gen)}
    net.update({f"trunk.{k}": v for k, v in mlp_init([opts.embed_dim] + [opts.hidden] * 3, gen).items()})
    for g in range(num_groups):
        net[f"out.{g}.weight"] = torch.rand(num_clients, opts.hidden, generator=gen)
        net[f"out.{g}.bias"] = torch.zeros(num_clients)
    return net


def layer_weights(net: Mapping[str, torch.Tensor], cid: int, num_groups: int) -> torch.Tensor:
    """``alpha_i`` (``groups x N``): ReLU head outputs normalised to sum 1 per group; an all-zero group -> own model."""
    z = torch.relu(mlp(part(net, "trunk"), net["embed"]))
    rows = []
    for g in range(num_groups):
        a = torch.relu(net[f"out.{g}.weight"] @ z + net[f"out.{g}.bias"])
        s = a.sum()
        if float(s.detach()) <= 0:
            a = torch.nn.functional.one_hot(torch.tensor(cid, device=a.device), a.numel()).to(a.dtype)
            s = a.sum()
        rows.append(a / s)
    return torch.stack(rows)


def layerwise_aggregate(alpha: torch.Tensor, thetas: Mapping[str, torch.Tensor], grouping: Sequence[Sequence[str]]
                        ) -> Params:
    """``theta-bar^l = sum_j alpha^{l,j} theta_j^l`` for every group ``l`` (``thetas``: name -> N x shape)."""
    out: Params = {}
    for g, names in enumerate(grouping):
        out.update(aggregate_row(alpha[g], {n: thetas[n] for n in names}))
    return out


# ------------------------------------------------------------------------------------------------ the method
@register_method
class PFedLA(Method):
    name = "pfedla"
    display_name = "pFedLA"
    options_cls = PFedLAOptions
    paper = "Ma et al., Layer-wised Model Aggregation for Personalized Federated Learning (pFedLA), CVPR 2022"

    def eval_models(self) -> dict[str, str]:
        """``"trained"``: the stored ``theta_i`` (FL-bench); ``"received"``: ``theta-bar_i`` built now."""
        return {"trained": "each client's stored model theta_i: its upload after its last local training (the "
                           "initial model for a client never selected)",
                "received": "the layer-wise aggregate theta-bar_i the client's hypernetwork builds now (what it "
                            "would receive)"}

    def declare(self, choice: str) -> Traits:
        """No global model; the client keeps none (its theta_i is the server's); the personalized model is the
        layer-wise aggregate its hypernetwork builds now; ``sequential`` runs a round's clients one by one."""
        return Traits(global_model=False, keeps_model=False, evaluates_received_model=True,
                      sequential_server=self.opts.sequential)

    def configure_evaluate(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """``[eval] model = "trained"``: the client's stored ``theta_i``; ``"received"``: ``theta-bar_i`` built
        now."""
        if self.traits.eval_choice == "received":
            return super().configure_evaluate(server, cid, sctx)
        return Message({"params": {n: t[cid].clone() for n, t in server["thetas"].items()}})

    def _grouping(self, run: RunInfo) -> list[list[str]]:
        return groups(list(run.init_params), self.opts.granularity)

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """Every stored ``theta_j`` is the initial model; hypernetworks are created at a client's first round."""
        return {"thetas": stack_copies(sctx.run.init_params, sctx.run.num_clients), "hn": {}, "opt": {}}

    def hypernet(self, server: State, cid: int, sctx: ServerCtx) -> dict:
        """Client ``cid``'s hypernetwork (a fresh one, from its own seed stream, before its first update)."""
        if cid in server["hn"]:
            return server["hn"][cid]
        gen = SeedTree(sctx.run.seed).torch("pfedla-hypernet", cid)
        net = init_hypernet(len(self._grouping(sctx.run)), sctx.run.num_clients, self.opts, gen)
        return {k: v.to(sctx.run.device) for k, v in net.items()}

    def personalized(self, server: State, cid: int, sctx: ServerCtx) -> Params:
        grouping = self._grouping(sctx.run)
        with torch.no_grad():
            alpha = layer_weights(self.hypernet(server, cid, sctx), cid, len(grouping))
            return layerwise_aggregate(alpha, server["thetas"], grouping)

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({"params": self.personalized(server, cid, sctx)})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Hypernetwork steps (chain rule through the aggregation), then the uploads replace the stored models."""
        grouping, thetas = self._grouping(sctx.run), server["thetas"]
        hn, opt = dict(server["hn"]), dict(server["opt"])
        for cid in sorted(replies):
            net = self.hypernet(server, cid, sctx)

            def build(n, cid=cid):
                return layerwise_aggregate(layer_weights(n, cid, len(grouping)), thetas, grouping)

            with torch.no_grad():
                bar = build(net)
            grads = vjp(net, build, proxy_cotangent(bar, replies[cid].params(), self.opts.sign))
            hn[cid], opt[cid] = sgd_step(net, grads, server["opt"].get(cid) or sgd_init(net), self.opts.hn_lr,
                                         self.opts.hn_momentum)
        new_thetas = with_rows(thetas, {cid: r.params() for cid, r in replies.items()})
        return {**server, "thetas": new_thetas, "hn": hn, "opt": opt}
