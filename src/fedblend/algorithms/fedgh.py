"""FedGH (Yi et al., "FedGH: Heterogeneous Federated Learning with Generalized Global Header", ACM MM 2023).

Each client's model is a feature extractor (``model.features``) plus a prediction header (``model.head``). Per
round (paper Alg. 1):

* the server sends its global header; the client replaces its local header with it (Sec. 4, "header
  substitution"), trains its whole model on its data with cross-entropy, and computes its local averaged
  representations (LARs, i.e. class prototypes: the mean ``f(x)`` of each class over its training data, the same
  Eq. as FedProto's prototypes, :func:`fedblend.algorithms.fedproto.class_prototypes`);
* the client uploads only the LARs with their labels;
* the server trains the global header on the uploaded ``(LAR, class)`` pairs with cross-entropy and SGD
  (Sec. 4, the server's header-training objective: ``min_phi sum_k sum_s l(H(R_k^s; phi), s)``), then sends it
  back.

The paper gives the objective but not the batching; we follow PFLlib's ``train_head``: ``server_epochs`` passes
over the round's pairs in a random order (the server's own random stream), mini-batches of
``server_batch_size`` (default: the clients' batch size), plain SGD with ``server_lr`` (optionally with momentum,
whose buffer lives in the server state as data, like the header itself).

Only prototypes go up and only the header comes down. The reported personalized model is what the paper's
client predicts with: its own feature extractor after its last local training with the current global header
(``[eval] model = "header"``, default; PFLlib evaluates right after sending the header to every client);
``"local"`` keeps the header the client trained itself.

``header_start = "client0"`` reproduces a property of PFLlib's FedGH (``servergh.py``): its server header *is*
client 0's head module (``self.head = self.clients[0].model.head``), so client 0's local training moves the
server's header every round, and the server trains on from client 0's trained header instead of the header it
sent. Under that option client 0 uploads its trained header with its prototypes (the only parameter upload of
the method; a reference-reproduction option, off by default: the paper's server trains the header it holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.prototypes import PROTOS, PrototypeUpload
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, clone, select
from fedblend.core.method import ClientCtx, Message, ServerCtx, State
from fedblend.core.optim import sgd_direction
from fedblend.core.training import TrainResult
from fedblend.models.zoo import FedModel

HEADER = "header"  # message record: the global header's parameters


@dataclass(frozen=True)
class FedGHOptions:
    """FedGH options (server-side header training; the paper's objective, PFLlib's batching)."""

    CHOICES: ClassVar[dict] = {"header_start": ("server", "client0")}
    RANGES: ClassVar[dict] = {"server_lr": "> 0", "server_epochs": "[1, 10000]", "server_batch_size": "[1, 1000000]",
                              "server_momentum": "[0, 1)"}

    server_lr: float = opt(0.01, "SGD learning rate of the header on the server (PFLlib server_learning_rate)")
    server_epochs: int = opt(1, "passes over the round's uploaded (LAR, label) pairs")
    server_batch_size: int | None = opt(None, "None: the clients' batch size (PFLlib)")
    server_momentum: float = opt(0.0, "SGD momentum of the header (buffer kept in the server state)")
    header_start: str = opt("server", '"server": the server trains the header it holds (paper); "client0": from '
                            "client 0's locally trained header when client 0 trained this round (PFLlib: its server "
                            "header is client 0's head module)")


# ------------------------------------------------------------------------------------------------ pure parts
def header_step(model: FedModel, head: Params, feats: torch.Tensor, labels: torch.Tensor, lr: float,
                momentum: float = 0.0, buf: Params | None = None) -> tuple[Params, Params | None, float]:
    """One SGD step of the header on a batch of prototypes: ``phi <- phi - lr * b``, ``b = momentum * b + g``
    (``b = g`` at first; torch.optim.SGD's rule), ``g`` the gradient of the mean cross-entropy of
    ``head(feats)`` against ``labels``. Returns the new header, the new buffers and the batch loss."""
    work = {k: v.detach().clone().requires_grad_(True) for k, v in head.items()}
    loss = F.cross_entropy(functional_call(model, work, (feats,), {"part": "head"}), labels)
    grads = torch.autograd.grad(loss, list(work.values()))
    new, new_buf = {}, ({} if momentum else None)
    for (k, p), g in zip(work.items(), grads):
        fresh = buf is None or k not in buf
        g = sgd_direction(g, p, None if fresh else buf[k], momentum, 0.0, fresh)
        if momentum:
            new_buf[k] = g.detach()
        new[k] = (p - lr * g).detach()
    return new, new_buf, float(loss.detach())


def train_header(model: FedModel, head: Params, feats: torch.Tensor, labels: torch.Tensor, opts: FedGHOptions,
                 batch_size: int, generator: torch.Generator, buf: Params | None = None
                 ) -> tuple[Params, Params | None, float]:
    """``server_epochs`` shuffled passes of :func:`header_step` over the pairs; returns header, buffers, mean loss."""
    losses = []
    for _ in range(opts.server_epochs):
        perm = torch.randperm(len(labels), generator=generator)
        for idx in torch.split(perm, batch_size):
            head, buf, loss = header_step(model, head, feats[idx], labels[idx], opts.server_lr,
                                          opts.server_momentum, buf)
            losses.append(loss)
    return head, buf, sum(losses) / max(len(losses), 1)


# ------------------------------------------------------------------------------------------------ the method
@register_method
class FedGH(PrototypeUpload):
    name = "fedgh"
    display_name = "FedGH"
    options_cls = FedGHOptions
    paper = "Yi et al., FedGH: Heterogeneous Federated Learning with Generalized Global Header, ACM MM 2023"

    def eval_models(self) -> dict[str, str]:
        return {"header": "each client's own feature extractor after its last local training with the current "
                          "global header",
                "local": "each client's own model after its last local training (its own trained header)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """The global header starts as the common initial model's header (what every client starts with)."""
        server: State = {"header": clone(select(sctx.run.init_params, sctx.model.head_names()))}
        if self.opts.server_momentum:
            server["header_momentum"] = None
        return server

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({HEADER: server["header"]})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Train the header on every uploaded (LAR, class) pair of the round (clients in id order, then shuffled)."""
        feats, labels = [], []
        for cid in sorted(replies):
            for c, v in replies[cid].params(PROTOS).items():
                feats.append(v)
                labels.append(int(c))
        if not labels:
            return server
        head = self._start_header(server, replies)
        bs = self.opts.server_batch_size or sctx.run.train.batch_size
        head, buf, loss = train_header(sctx.model, head, torch.stack(feats), torch.tensor(labels, device=sctx.run.device),
                                       self.opts, bs, sctx.tree.torch("header"), server.get("header_momentum"))
        sctx.stats["header_loss"] = loss
        out = {**server, "header": head}
        if self.opts.server_momentum:
            out["header_momentum"] = buf
        return out

    def _start_header(self, server: State, replies: Mapping[int, Message]) -> Params:
        """The header the server trains this round: its own, or (``header_start = "client0"``) client 0's trained
        one when client 0 replied with it."""
        if self.opts.header_start == "client0" and 0 in replies and HEADER in replies[0].arrays:
            return clone(replies[0].params(HEADER))
        return server["header"]

    # ------------------------------------------------------------------------------------------ client
    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The prototypes (:class:`PrototypeUpload`); with ``header_start = "client0"`` client 0 adds its
        trained header."""
        out = super().reply(res, msg, cstate, ctx)
        if self.opts.header_start != "client0" or ctx.cid != 0:
            return out
        return Message({**out.arrays, HEADER: select(res.params, ctx.model.head_names())}, out.metrics)

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Header substitution: the client's own feature extractor with the received global header."""
        return {**cstate["params"], **msg.params(HEADER)}

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        if self.traits.eval_choice == "local":
            return cstate["params"]
        return {**cstate["params"], **msg.params(HEADER)}
