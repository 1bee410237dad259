"""Adaptive Local Aggregation (ALA), the client-initialisation part of FedALA, usable on any method by name.

Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023.

Instead of overwriting its old local model with the received global model, client ``i`` builds its starting
point element-wise (paper Eq. 2-4)::

    theta_hat = theta_local * (1 - W) + theta_global * W     on the top p layers   (Eq. 2 with W_1 = 1 - W)
    theta_hat = theta_global                                 on the lower layers    (Eq. 4: the ones block)

which is Eq. 3/4, ``theta_local + (theta_global - theta_local) * W``, written in the Eq. 2 form so that W = 1
gives exactly the global tensors and W = 0 exactly the local ones (FedAvg's overwrite is W = 1 bit for bit).
``W`` (one weight per element of the top p layers) starts at ones (Alg. 1 line 4), lives in the client state
``cstate["ala"]["weights"]`` across rounds, and is learned on an s% sample of the client's training data with
both models frozen (Eq. 5; appendix A, Eq. 7)::

    W <- clip(W - eta * dL/dtheta_hat * (theta_global - theta_local), 0, 1)      per mini-batch

The first round in which a client's global and local models differ is the "initial stage" (Alg. 1 lines
10-13): weight-learning epochs repeat until W converges, measured as in the authors' code: more than ``window``
recorded epoch losses and their (population) std over the last ``window`` below ``threshold``; ``cap`` bounds
the epochs (with a warning when reached). Later rounds learn one epoch (lines 14-16). ALA is skipped while the
top layers of the global and local models are equal (the first round: Theta^0 = Theta_i^0), since W could not
move and theta_hat equals the received model.

In the :class:`~fedblend.core.method.Method` template, "local" is ``cstate["params"]`` (the client's model after
its last local training; ALA declares ``needs_local_model`` so every host method keeps it) and "global" is what
``client_init`` made from the received message, so ALA composes with every method that keeps the template
(``fedavg+ala``, ``fedprox+ala``, ...) and runs entirely on the client. See ``docs/methods/fedala.md``.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.mix import interpolate
from fedblend.algorithms.registry import register_transform
from fedblend.common.errors import ConfigError
from fedblend.common.options import opt
from fedblend.common.params import Params, layer_of
from fedblend.core.method import ClientCtx, ClientTransform, Message, Method, State
from fedblend.models.zoo import FedModel


@dataclass(frozen=True)
class ALAOptions:
    """Options of ALA (the ``[ala]`` table, or ``[options]`` of ``fedala``). Defaults are the paper's."""

    CHOICES: ClassVar[dict] = {"sample": ("random", "window"), "record": ("last", "mean"),
                               "eval": ("ala", "stored", "trained"), "eval_stream": ("train", "eval")}
    RANGES: ClassVar[dict] = {"eta": ">= 0", "s": "(0, 100]", "p": "[1, 1000]", "threshold": ">= 0", "window": "[1, 100000]",
                              "cap": "[1, 1000000]", "batch_size": "[1, 1000000]"}

    eta: float = opt(1.0, "learning rate of the weight learning (paper: 1.0)")
    s: float = opt(80.0, "percent of the client's training data used for weight learning each round (paper: 80)")
    p: int = opt(1, "range of ALA in layers from the output (paper: 1 = output layer; code layer_idx = 2 * p)")
    threshold: float = opt(0.01, "initial stage: stop when std of the last `window` losses < threshold (README 0.01)")
    window: int = opt(10, "number of recorded epoch losses the std is taken over (code: 10)")
    cap: int = opt(100, "most weight-learning epochs in the initial stage (the code has none; a warning when hit)")
    sample: str = opt("random", '"random": a random s% subset (paper); "window": contiguous s% at a random offset '
                                "(code)")
    batch_size: int | None = opt(None, "mini-batch size of the weight learning; None = the client's training batch "
                                       "size")
    record: str = opt("last", "loss recorded per epoch for the stop rule: \"last\" batch's (code) or the epoch \"mean\"")
    eval: str = opt("ala", 'evaluated model: "ala" = ALA-initialised model (Alg. 1 output; PFLlib), "stored" = Eq. 4 '
                           "with the stored W (no learning), \"trained\" = the method's own (model after local training)")
    eval_stream: str = opt("train", "eval = \"ala\": learn W from the next round's training stream (the blend the client"
                                    " then trains from; learned once) or from this round's \"eval\" stream (earlier "
                                    "runs)")


# ------------------------------------------------------------------------------------------------ pure parts
def ala_names(model: FedModel, p: int) -> list[str]:
    """Parameter names of the top ``p`` layers (paper Eq. 4: W_i^p has the shape of the p higher layers)."""
    return model.param_names(model.top_layers(p))


def blend(local: Mapping[str, torch.Tensor], glob: Mapping[str, torch.Tensor],
          weights: Mapping[str, torch.Tensor]) -> Params:
    """Eq. 4: global tensors below, ``local * (1 - W) + global * W`` on the tensors that have a weight."""
    return {**glob, **interpolate(glob, local, weights, names=weights)}


def ala_step(model: FedModel, local: Params, glob: Params, weights: Params, x: torch.Tensor,
             y: torch.Tensor, eta: float, features: torch.Tensor | None = None) -> tuple[Params, float]:
    """One weight-learning step on one batch (Eq. 5 / Eq. 7): only the top layers get gradients.

    Returns ``clip(W - eta * dL/dtheta_hat * (global - local), 0, 1)`` and the batch loss at the old W. When every
    ALA layer is a head layer, ``features`` (the frozen global body's output on ``x``) may be passed: the logits
    are then ``head(features)``, the same operations as the full forward pass, without recomputing the body.
    """
    top = {n: t.requires_grad_(True) for n, t in interpolate(glob, local, weights, names=weights).items()}
    if features is None:
        out = functional_call(model, {**glob, **top}, (x,))
    else:
        out = functional_call(model, {**glob, **top}, (features,), {"part": "head"})
    loss = F.cross_entropy(out, y)
    grads = torch.autograd.grad(loss, list(top.values()))
    new = {}
    with torch.no_grad():
        for (n, w), g in zip(weights.items(), grads):
            new[n] = (w - eta * g * (glob[n] - local[n])).clamp_(0.0, 1.0)
    return new, float(loss.detach())


def head_only(model: FedModel, names: list[str]) -> bool:
    """Whether every ALA tensor belongs to a head layer (then the body below is frozen at the global model)."""
    return all(layer_of(n) in model.head_layers for n in names)


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """The authors' stop rule for the initial stage: more than ``window`` losses recorded and the population
    std of the last ``window`` of them below ``threshold``."""
    return len(losses) > window and float(np.std(losses[-window:])) < threshold


def sample_indices(n: int, s: float, mode: str, generator: torch.Generator) -> torch.Tensor:
    """D_i^{s,t}: ``int(s% * n)`` (at least 1) sample indices, in the order the epochs of this round visit them.

    ``random`` (paper, Sec. ALA): a uniformly random subset in random order. ``window`` (authors' code): the
    contiguous block ``[o, o + k)`` of the client's training data at a uniformly random offset ``o``.
    """
    k = min(n, max(1, int(s / 100.0 * n)))
    if mode == "random":
        return torch.randperm(n, generator=generator)[:k]
    if mode == "window":
        o = int(torch.randint(0, n - k + 1, (1,), generator=generator))
        return torch.arange(o, o + k)
    raise ValueError(f"unknown ALA sample mode {mode!r}")


@dataclass
class ALAResult:
    params: Params  # theta_hat (Eq. 4 with the learned W)
    weights: Params  # the learned W
    losses: list[float]  # recorded loss per weight-learning epoch
    epochs: int
    initial: bool  # whether this was the initial stage
    capped: bool  # initial stage stopped by the cap, not by the stop rule


def learn_weights(model: FedModel, local: Params, glob: Params, weights: Params, x: torch.Tensor,
                  y: torch.Tensor, opts: ALAOptions, batch_size: int, generator: torch.Generator,
                  initial: bool) -> ALAResult:
    """Weight learning of one round (Alg. 1 lines 9-17): sample D_i^{s,t}, train W one epoch (or until the stop
    rule in the initial stage), then build theta_hat by Eq. 4. ``local`` / ``glob`` are not modified."""
    local = {n: local[n].detach() for n in weights}
    glob = {k: v.detach() for k, v in glob.items()}
    w = {n: v.detach().clone() for n, v in weights.items()}
    losses: list[float] = []
    capped = False
    if len(y) > 0:
        idx = sample_indices(len(y), opts.s, opts.sample, generator)
        parts = list(torch.split(idx, batch_size))
        feats: list[torch.Tensor | None] = [None] * len(parts)
        cache = head_only(model, list(w))  # the body is frozen: its output per batch is the same every epoch
        while True:
            batch_losses, sizes = [], []
            for i, b in enumerate(parts):
                if cache and feats[i] is None:
                    with torch.no_grad():
                        feats[i] = functional_call(model, glob, (x[b],), {"part": "features"})
                w, loss = ala_step(model, local, glob, w, x[b], y[b], opts.eta, feats[i])
                batch_losses.append(loss)
                sizes.append(len(b))
            losses.append(batch_losses[-1] if opts.record == "last" else float(np.average(batch_losses, weights=sizes)))
            if not initial or converged(losses, opts.window, opts.threshold):
                break
            if len(losses) >= opts.cap:
                capped = True
                break
    return ALAResult(blend({**glob, **local}, glob, w), w, losses, len(losses), initial, capped)


def fingerprint(params: Mapping[str, torch.Tensor]) -> str:
    """A digest of names, dtypes, shapes and bytes of ``params`` (memo keys; no tensor copies kept)."""
    h = hashlib.blake2b(digest_size=16)
    for n, t in params.items():
        t = t.detach().cpu().contiguous()
        h.update(f"{n}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def weight_summary(model: FedModel, weights: Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per layer: ``[mean, q10, q50, q90]`` of the elements of W (weight and bias together)."""
    out: dict[str, list[float]] = {}
    for layer in model.layers:
        vals = [w.reshape(-1) for n, w in weights.items() if layer_of(n) == layer]
        if vals:
            v = torch.cat(vals).double()
            q = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)) if v.numel() else v
            out[layer] = [float(v.mean())] + [float(a) for a in q]
    return out


# ------------------------------------------------------------------------------------------------ the transform
@register_transform
class ALA(ClientTransform):
    """ALA as a client transform: ``cstate["ala"] = {"weights", "initial_done", "history"}``."""

    name = "ala"
    options_cls = ALAOptions
    needs_local_model = True  # theta_local of Eq. 2: the client's model after its last local training
    requires_global = True  # theta_global of Eq. 2: a global model to blend from
    own_loop = True  # W is learned by its own loop (Eq. 5), plain code on the client before the TrainSpec

    def init_state(self) -> State:
        return {"weights": None, "initial_done": False, "history": []}

    def check_model(self, method: Method, model: FedModel) -> None:
        if not 1 <= self.opts.p <= len(model.layers):
            where = "options" if method.name == "fedala" else self.key
            raise ConfigError(f"{where}.p must be in [1, {len(model.layers)}] for model {type(model).__name__} (its "
                              f"layers: {', '.join(model.layers)}), got {self.opts.p}")

    def _learn(self, glob: Params, local: Params, st: State, ctx: ClientCtx) -> ALAResult | None:
        """Weight learning of client ``ctx.cid`` (None when skipped: the top layers of both models are equal).
        Randomness: ``ctx.tree.torch("ala")`` only."""
        names = ala_names(ctx.model, self.opts.p)
        if all(torch.equal(glob[n], local[n]) for n in names):
            return None  # nothing to learn: theta_hat = the received model
        weights = st["weights"] or {n: torch.ones_like(glob[n]) for n in names}
        if set(weights) != set(names):
            raise ValueError(f"stored ALA weights cover {sorted(weights)}, expected {names} (p changed?)")
        bs = self.opts.batch_size or ctx.train.batch_size
        res = learn_weights(ctx.model, local, glob, weights, ctx.data.train_x, ctx.data.train_y, self.opts, bs,
                            ctx.tree.torch("ala"), initial=not st["initial_done"])
        if res.capped:
            warnings.warn(f"ALA initial stage of client {ctx.cid} (round {ctx.rnd + 1}) stopped at the cap of "
                          f"{self.opts.cap} epochs: std of the last {self.opts.window} losses "
                          f"{float(np.std(res.losses[-self.opts.window:])):.4g} >= threshold {self.opts.threshold}",
                          RuntimeWarning, stacklevel=2)
        return res

    def _memo_key(self, glob: Params, local: Params, st: State, ctx: ClientCtx) -> tuple:
        """Everything the weight learning of a round depends on: the round (its training stream), the received
        model, the client's top layers, its W and its stage, and the options."""
        names = ala_names(ctx.model, self.opts.p)
        return (ctx.rnd, fingerprint(glob), fingerprint({n: local[n] for n in names}),
                fingerprint(st["weights"] or {}), bool(st["initial_done"]), repr(self.opts))

    def _run(self, glob: Params, local: Params, st: State, ctx: ClientCtx,
             memoise: bool = False) -> tuple[Params, State, ALAResult | None]:
        """ALA on client ``ctx.cid``: theta_hat, the new ALA state and the learning record (None when skipped).

        ``memoise`` (an evaluation on this round's training stream, see :meth:`eval_params`) keeps the learning in
        ``ctx.cache`` under its inputs; a later call in the same round with the same inputs reuses it instead of
        learning again (same result). Inputs are fingerprinted only when a memo of this round exists or is kept."""
        memo = ctx.cache.get(self.key)
        key = self._memo_key(glob, local, st, ctx) if memoise or (memo is not None and memo[0][0] == ctx.rnd) else None
        res = memo[1] if key is not None and memo is not None and memo[0] == key else self._learn(glob, local, st, ctx)
        if memoise:
            ctx.cache[self.key] = (key, res)
        if res is None:
            return glob, st, None
        hat = blend({**glob, **local}, glob, res.weights)
        new_st = {**st, "weights": res.weights, "initial_done": st["initial_done"] or res.epochs > 0}
        return hat, new_st, res

    def apply(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        t0 = time.perf_counter()
        st = cstate.get(self.key) or self.init_state()
        hat, st, res = self._run(params, cstate["params"], st, ctx)
        stats: dict[str, Any] = {"ala_skipped": float(res is None)}
        if res is not None:
            summary = weight_summary(ctx.model, res.weights)
            stats.update(ala_epochs=res.epochs, ala_initial=float(res.initial), ala_capped=float(res.capped),
                         ala_loss=res.losses[-1] if res.losses else None)
            for layer, (mean, q10, q50, q90) in summary.items():
                stats.update({f"ala_w_mean.{layer}": mean, f"ala_w_q10.{layer}": q10,
                              f"ala_w_q50.{layer}": q50, f"ala_w_q90.{layer}": q90})
            st = {**st, "history": list(st["history"]) + [
                {"round": ctx.rnd + 1, "epochs": res.epochs, "loss": stats["ala_loss"], "w": summary}]}
        stats["ala_seconds"] = time.perf_counter() - t0
        ctx.stats.update(stats)
        return hat, {**cstate, self.key: st}

    def eval_params(self, method: Method, msg: Message, cstate: State, ctx: ClientCtx, params: Params) -> Params:
        """``eval = "ala"``: the model this client would start its next round from (Alg. 1 returns these
        theta_hat; PFLlib evaluates them), from the evaluation message (what the client would receive now), with W
        learned as in training but not kept. ``eval_stream = "train"`` (default) draws the weight-learning sample
        from the client's training stream of the next round, so the evaluated theta_hat *is* the one the client
        trains from if it joins that round, and the learning is done once (memoised, see :meth:`_run`);
        ``"eval"`` draws it from the evaluation stream of this round (how earlier results were evaluated).
        ``"stored"``: Eq. 4 with the stored W.
        ``"trained"``: the client's model after its last local training."""
        if self.opts.eval == "trained":
            return cstate["params"]
        glob = method.client_init(msg, cstate, ctx)
        st = cstate.get(self.key) or self.init_state()
        if self.opts.eval == "stored":
            return blend(cstate["params"], glob, st["weights"] or {})
        if self.opts.eval_stream == "train":  # exactly the blend the client would train from in round rnd + 1
            ctx = replace(ctx, rnd=ctx.rnd + 1, tree=ctx.tree_for("train", ctx.rnd + 1))
            return self._run(glob, cstate["params"], st, ctx, memoise=True)[0]
        return self._run(glob, cstate["params"], st, ctx)[0]

    def eval_description(self, method: Method, current: str) -> str:
        if self.opts.eval == "ala":
            where = ("the next round's training stream, i.e. exactly the model the client trains from when it "
                     "joins the next round" if self.opts.eval_stream == "train" else "the eval streams")
            return ("the ALA-initialised model theta_hat (FedALA Eq. 4, W learned one more epoch, or the initial "
                    f"stage, on {where}; not kept) from the aggregated global model and the client's model "
                    "after its last local training, i.e. its start of the next round, before local training")
        if self.opts.eval == "stored":
            return ("Eq. 4 of FedALA with the client's stored ALA weights, from the aggregated global model and the "
                    "client's model after its last local training (no weight learning at evaluation)")
        return ("each client's model after its last local training, which started from the ALA-initialised "
                "model")
