"""pFedHN (Shamsian, Navon, Fetaya, Chechik, "Personalized Federated Learning using Hypernetworks", ICML 2021).

The server holds a hypernetwork ``h(v_i; phi)``: a learned embedding ``v_i`` per client, an MLP trunk and one
linear head per parameter tensor of the target model (Sec. 3, App. "Hypernetwork architecture"). Per client
(paper Alg. 1):

* line 4: ``theta_i = h(v_i; phi)`` -- the server generates client ``i``'s model and sends it;
* lines 5-7: the client trains ``theta_i`` locally (the run's ``[train]`` settings, or ``inner_steps`` SGD steps
  as the paper's K) and sends back its trained ``theta~_i``;
* line 8: ``Delta theta_i = theta_i - theta~_i`` (generated minus trained, as the authors' code);
* lines 9-10: ``phi <- phi - beta (grad_phi theta_i)^T Delta theta_i`` and
  ``v_i <- v_i - beta (grad_{v_i} theta_i)^T Delta theta_i`` -- a vector-Jacobian product
  (:func:`fedblend.algorithms.parts.hypernet.vjp`); the optimiser is the authors' SGD (momentum 0.9, weight decay
  1e-3 on every parameter, the embeddings included: one ``weight_decay`` for both parameter groups, as the
  authors' code and FL-bench; ``embed_decay = false`` leaves the embeddings undecayed), gradient-norm clip 50, kept
  as data in the server state.

Clients are processed one after another within a round (``sequential = true``, Alg. 1 samples one client per
step, as the authors' code); ``sequential = false`` generates every model of a round from the same
hypernetwork and applies the mean of the clients' gradients once.

pFedHN-PC (``personal_head = true``, Sec. 3.2): the hypernetwork generates the feature extractor only; each
client keeps and trains its own classifier (the head), which never travels.

There is no global model. The personalized model evaluated (``[eval] model``) is by default (``"received"``) the
one the hypernetwork generates for the client now (+ its own head for pFedHN-PC), as the authors' code and
FL-bench evaluate it; ``"trained"`` scores the client's model after its last local training instead (what the FedAPA authors'
framework scores for every method: each client's current local model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.parts.hypernet import part, proxy_cotangent, vjp
from fedblend.algorithms.parts.nets import mlp, mlp_init
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, Method, RunInfo, ServerCtx, State, Traits
from fedblend.core.optim import clip_grad_norm, global_norm, sgd_init, sgd_step
from fedblend.core.template import record_training, shared_names, train_spec


@dataclass(frozen=True)
class PFedHNOptions:
    """Defaults: the authors' code (embedding dim ``1 + N/4``, 3 hidden layers of 100, SGD 1e-2)."""

    RANGES: ClassVar[dict] = {"embed_dim": "[0, 4096]", "hidden": "[1, 1024]", "n_hidden": "[0, 64]", "hn_lr": "> 0",
                              "embed_lr": ">= 0", "hn_momentum": "[0, 1)", "hn_weight_decay": ">= 0",
                              "grad_clip": ">= 0", "inner_steps": "[0, 1000000]"}

    embed_dim: int = opt(0, "0: int(1 + num_clients / 4) (authors' code)")
    hidden: int = opt(100, "trunk width")
    n_hidden: int = opt(3, "hidden layers of the trunk after its input layer")
    hn_lr: float = opt(1e-2, "beta of Alg. 1")
    embed_lr: float = opt(0.0, "0: hn_lr")
    hn_momentum: float = opt(0.9, "SGD momentum of the hypernetwork optimiser (authors' code: 0.9)")
    hn_weight_decay: float = opt(1e-3, "SGD weight decay of the hypernetwork optimiser (authors' code: 1e-3)")
    embed_decay: bool = opt(True, "hn_weight_decay on the embeddings too (authors' code, FL-bench: one weight_decay "
                                  "for both parameter groups)")
    grad_clip: float = opt(50.0, "0: off")
    inner_steps: int = opt(0, "0: the run's [train] epochs; K > 0: K SGD steps (paper: 50)")
    personal_head: bool = opt(False, "pFedHN-PC")
    sequential: bool = opt(True, "one client after another (Alg. 1); False: one mean step per round")


# ------------------------------------------------------------------------------------------------ pure parts
def init_hypernet(targets: Mapping[str, torch.Tensor], num_clients: int, opts: PFedHNOptions,
                  gen: torch.Generator) -> dict:
    """Embeddings ``N(0, 1)`` (``nn.Embedding``), trunk and heads as ``nn.Linear`` (uniform +-1/sqrt(fan_in))."""
    e = opts.embed_dim or int(1 + num_clients / 4)
    net = {"embed": torch.randn(num_clients, e, generator=gen)}
    net.update({f"trunk.{k}": v for k, v in mlp_init([e] + [opts.hidden] * (opts.n_hidden + 1), gen).items()})
    for name, t in targets.items():
        head = mlp_init([opts.hidden, t.numel()], gen)
        net[f"out.{name}.weight"], net[f"out.{name}.bias"] = head["l0.weight"], head["l0.bias"]
    return net


def generate(net: Mapping[str, torch.Tensor], cid: int, shapes: Mapping[str, torch.Size]) -> Params:
    """Alg. 1 line 4: ``theta_i = h(v_i; phi)`` for every target tensor."""
    z = mlp(part(net, "trunk"), net["embed"][cid])
    return {n: (net[f"out.{n}.weight"] @ z + net[f"out.{n}.bias"]).reshape(s) for n, s in shapes.items()}


def hypernet_grads(net: Mapping[str, torch.Tensor], cid: int, shapes: Mapping[str, torch.Size],
                   trained: Mapping[str, torch.Tensor]) -> dict:
    """Alg. 1 lines 8-10: ``(d theta_i / d (phi, v))^T (theta_i - theta~_i)``."""
    generated = generate(net, cid, shapes)
    return vjp(net, lambda n: generate(n, cid, shapes), proxy_cotangent(generated, trained))


# ------------------------------------------------------------------------------------------------ the method
@register_method
class PFedHN(Method):
    name = "pfedhn"
    display_name = "pFedHN"
    options_cls = PFedHNOptions
    paper = "Shamsian et al., Personalized Federated Learning using Hypernetworks (pFedHN), ICML 2021"

    def eval_models(self) -> dict[str, str]:
        """``"received"``: what the hypernetwork generates now (authors' code, FL-bench); ``"trained"``: the
        client's model after its last local training (the FedAPA framework's scoring)."""
        return {"received": "the model the server's hypernetwork generates for the client now (pFedHN-PC: with "
                            "the client's own head)",
                "trained": "each client's model after its last local training (the initial model for a client "
                           "never selected)"}

    def declare(self, choice: str) -> Traits:
        """No global model; the generated model (+ own head for pFedHN-PC) is evaluated, or with ``"trained"``
        the client's own; pFedHN-PC keeps the client's own head; ``sequential`` runs the clients of a round one
        after another."""
        trained = choice == "trained"
        return Traits(global_model=False, keeps_model=self.opts.personal_head or trained,
                      evaluates_received_model=not trained, evaluates_own_model=trained,
                      sequential_server=self.opts.sequential, shares="body" if self.opts.personal_head else "all")

    def _shapes(self, run: RunInfo) -> dict[str, torch.Size]:
        return {n: run.init_params[n].shape for n in shared_names(self, run)}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        targets = {n: sctx.run.init_params[n] for n in shared_names(self, sctx.run)}
        net = init_hypernet(targets, sctx.run.num_clients, self.opts, sctx.tree.torch("hypernet-init"))
        net = {k: v.to(sctx.run.device) for k, v in net.items()}
        return {"hn": net, "opt": sgd_init(net)}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        with torch.no_grad():
            return Message({"params": generate(server["hn"], cid, self._shapes(sctx.run))})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Alg. 1 lines 8-10 (the mean over the replies where ``sequential = false``), the authors' clip and SGD;
        ``pfedhn_grad_norm`` records the 2-norm of the gradient applied (after the clip)."""
        net, shapes = server["hn"], self._shapes(sctx.run)
        grads = None
        for cid in sorted(replies):
            g = hypernet_grads(net, cid, shapes, replies[cid].params())
            grads = g if grads is None else {k: grads[k] + g[k] for k in g}
        if len(replies) > 1:  # (a division by 1 changes no bit)
            grads = {k: v / len(replies) for k, v in grads.items()}
        if self.opts.grad_clip:
            grads, sctx.stats["pfedhn_grad_norm"] = clip_grad_norm(grads, self.opts.grad_clip)
        else:
            sctx.stats["pfedhn_grad_norm"] = global_norm(list(grads.values()))
        lrs = {"embed": self.opts.embed_lr or self.opts.hn_lr}
        net, opt = sgd_step(net, grads, server["opt"], self.opts.hn_lr, self.opts.hn_momentum,
                            self.opts.hn_weight_decay, lrs=lrs, decay={"embed": self.opts.embed_decay}, donate=True)
        return {**server, "hn": net, "opt": opt}

    # ------------------------------------------------------------------------------------------ client
    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """The template's one spec, of ``inner_steps`` steps where set."""
        kw = {"steps": self.opts.inner_steps} if self.opts.inner_steps else {}
        res = yield train_spec(self, params, msg, cstate, ctx, **kw)
        return res, record_training(res, cstate, ctx)

