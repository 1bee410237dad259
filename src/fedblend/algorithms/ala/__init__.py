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
(``fedavg+ala``, ``fedprox+ala``, ...) and runs entirely on the client. The received model need not be a global
one (``requires_received``): FedALA's Table 4 ("Applicability of ALA") also applies ALA to FedAMP, whose server
sends each client its personalized cloud model ``u_i`` (``fedamp+ala``: theta = u_i in Eq. 2-4, the host's loss
terms unchanged). See ``docs/methods/fedala.md``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedblend.algorithms.ala.learning import (
    ALAOptions,
    ALAResult,
    ala_names,
    blend,
    fingerprint,
    learn_weights,
    weight_summary,
)
from fedblend.algorithms.registry import register_transform
from fedblend.common.errors import ConfigError
from fedblend.common.params import Params
from fedblend.core.diagnostics import Curves, Histogram, Item, RunFiles, register_diagnostics
from fedblend.core.method import ClientCtx, ClientTransform, Message, Method, State
from fedblend.core.traits import TransformTraits
from fedblend.models.zoo import FedModel


def learned_weights(run: RunFiles) -> list[Item]:
    """``fedblend report --diagnostics``: per layer, W (Eq. 5) pooled over the clients at the checkpoint and its
    median, mean and 10-90% band across rounds (each client's median in grey); ALA's share of the client time
    and its weight-learning epochs per round."""
    items: list[Item] = []
    if run.has_checkpoint():
        pooled: dict[str, list[torch.Tensor]] = {}
        for st in run.checkpoint()["clients"].values():
            for n, w in ((st.get("ala") or {}).get("weights") or {}).items():
                pooled.setdefault(n.rsplit(".", 1)[0], []).append(w.reshape(-1).float().cpu())
        items += [Histogram(f"ala_w_{ly}", f"W of {ly} at the checkpoint", torch.cat(ws),
                            "weight (0 = keep local, 1 = take global)", (0.0, 1.0), log=True) for ly, ws in pooled.items()]
    rows = run.metrics
    for ly in sorted({k.split(".", 1)[1] for m in rows for k in m if k.startswith("ala_w_q50.")}):
        got = [m for m in rows if m.get(f"ala_w_q50.{ly}") is not None]
        per: dict[int, list[tuple[int, float]]] = {}
        for m in rows:
            pc = m.get("stats_per_client") or {}
            for cid, v in zip(pc.get("clients", ()), pc.get(f"ala_w_q50.{ly}", ())):
                if v is not None:
                    per.setdefault(cid, []).append((m["round"], v))
        items.append(Curves(f"ala_w_rounds_{ly}", f"W of {ly} across rounds (grey: each client's median)", "weight",
                            {name: [(m["round"], m[f"ala_w_{s}.{ly}"]) for m in got]
                             for name, s in (("median", "q50"), ("mean", "mean"))},
                            ("q10-q90 (mean over clients)", [(m["round"], m[f"ala_w_q10.{ly}"], m[f"ala_w_q90.{ly}"])
                                                             for m in got]), list(per.values()), (-0.02, 1.02)))
    learn = "no weight learning yet (ALA learns W from round 2 on)"
    items.append(Curves("ala_share", "ALA's share of the clients' training time", "% of client time",
                        {"ALA": [(m["round"], 100 * m["ala_share"]) for m in rows if m.get("ala_share") is not None]},
                        ylim=(0.0, None), empty="no ALA timings in metrics.jsonl"))
    items.append(Curves("ala_epochs", "weight-learning epochs per client (mean)", "epochs",
                        {"epochs": [(m["round"], m["ala_epochs"]) for m in rows if m.get("ala_epochs") is not None]},
                        ylim=(0.0, None), empty=learn))
    return items


# ------------------------------------------------------------------------------------------------ the transform
@register_transform
@register_diagnostics(learned_weights)
class ALA(ClientTransform):
    """ALA as a client transform: ``cstate["ala"] = {"weights", "initial_done"}``, what the next round needs and
    nothing that grows with the rounds; the per-round diagnostics (epochs, loss, W quantiles) are client stats,
    kept per client in the round's metrics (``stats_per_client``)."""

    name = "ala"
    display_name = "ALA"
    options_cls = ALAOptions

    def declare(self) -> TransformTraits:
        """theta_local of Eq. 2 is the client's model after its last local training; theta of Eq. 2 is the model
        the server sends (global, or personalized: FedAMP's u_i); W is learned by its own loop (Eq. 5), plain
        code on the client before the TrainSpec; each learning client's record is kept in the round's metrics."""
        return TransformTraits(needs_local_model=True, requires_received=True, own_loop=True,
                               per_client_stats=("ala_epochs", "ala_loss", "ala_w_"))

    def init_state(self) -> State:
        return {"weights": None, "initial_done": False}

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
        if res.nonfinite and res.initial:  # a later round learns one epoch anyway
            warnings.warn(f"ALA initial stage of client {ctx.cid} (round {ctx.rnd + 1}) stopped at epoch "
                          f"{res.epochs}: its loss is {res.losses[-1]} (non-finite models or data)",
                          RuntimeWarning, stacklevel=2)
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
        st = {k: v for k, v in st.items() if k != "history"}  # a state saved before issue 22 carried a history
        hat, st, res = self._run(params, cstate["params"], st, ctx)
        stats: dict[str, Any] = {"ala_skipped": float(res is None)}
        if res is not None:
            summary = weight_summary(ctx.model, res.weights)
            stats.update(ala_epochs=res.epochs, ala_initial=float(res.initial), ala_capped=float(res.capped),
                         ala_loss=res.losses[-1] if res.losses else None)
            for layer, (mean, q10, q50, q90) in summary.items():
                stats.update({f"ala_w_mean.{layer}": mean, f"ala_w_q10.{layer}": q10,
                              f"ala_w_q50.{layer}": q50, f"ala_w_q90.{layer}": q90})
        stats["ala_seconds"] = time.perf_counter() - t0
        ctx.stats.update(stats)
        return hat, {**cstate, self.key: st}

    def eval_params(self, method: Method, msg: Message, cstate: State, ctx: ClientCtx, params: Params) -> Params:
        """The model ``[eval] model`` names (:meth:`eval_models`); ``params`` is what ``client_init`` made of the
        evaluation message (the model the client would receive now), handed over by the template. ``"ala"``: the
        model this client would start its next round from (Alg. 1 returns these theta_hat; PFLlib evaluates
        them), with W learned as in training but not kept. ``eval_stream = "train"`` (default) draws the
        weight-learning sample from the client's training stream of the next round, so the evaluated theta_hat
        *is* the one the client trains from if it joins that round, and the learning is done once (memoised,
        see :meth:`_run`); ``"eval"`` draws it from the evaluation stream of this round (how earlier results
        were evaluated). ``"stored"``: Eq. 4 with the stored W. ``"trained"``: the client's model after its
        last local training."""
        choice = method.traits.eval_choice
        if choice == "trained":
            return cstate["params"]
        st = cstate.get(self.key) or self.init_state()
        if choice == "stored":
            return blend(cstate["params"], params, st["weights"] or {})
        if self.opts.eval_stream == "train":  # exactly the blend the client would train from in round rnd + 1
            ctx = replace(ctx, rnd=ctx.rnd + 1, tree=ctx.tree_for("train", ctx.rnd + 1))
            return self._run(params, cstate["params"], st, ctx, memoise=True)[0]
        return self._run(params, cstate["params"], st, ctx)[0]

    def eval_models(self, method: Method, current: dict[str, str]) -> dict[str, str]:
        """ALA's ``[eval] model`` choices, in place of the host's: "ala" (default), "stored", "trained"."""
        received = ("the aggregated global model" if method.traits.global_model else
                    "the personalized model the server would send the client now")
        where = ("the next round's training stream, i.e. exactly the model the client trains from when it "
                 "joins the next round" if self.opts.eval_stream == "train" else "the eval streams")
        return {
            "ala": ("the ALA-initialised model theta_hat (FedALA Eq. 4, W learned one more epoch, or the initial "
                    f"stage, on {where}; not kept) from {received} and the client's model "
                    "after its last local training, i.e. its start of the next round, before local training"),
            "stored": (f"Eq. 4 of FedALA with the client's stored ALA weights, from {received} and the "
                       "client's model after its last local training (no weight learning at evaluation)"),
            "trained": ("each client's model after its last local training, which started from the "
                        "ALA-initialised model"),
        }
