"""APFL (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461, 2020).

Every client ``i`` keeps a local model ``v_i`` and a mixing weight ``alpha_i``; its personalized model is the
mixture (paper Eq. 3)::

    v_bar_i = alpha_i v_i + (1 - alpha_i) w

Per local step on a mini-batch ``xi`` (paper Alg. 1, "local descent APFL", and Eq. 10 for alpha)::

    w       <- w       - eta grad f_i(w; xi)                                   (the global copy, FedAvg's step)
    v_i     <- v_i     - eta grad_v f_i(v_bar_i; xi)      = - eta alpha_i grad f_i(v_bar_i; xi)
    alpha_i <- alpha_i - eta grad_alpha f_i(v_bar_i; xi)  = - eta <v_i - w, grad f_i(v_bar_i; xi)>

all three from the same batch and the values before the step; the server averages the clients' ``w`` (by data
size, FedAvg's rule). Here the three updates are one :class:`~fedblend.core.training.TrainSpec` over the
parameter dictionary ``w`` + ``apfl_v`` (``v_i``, flattened) + ``apfl_alpha`` (``alpha_i``, a scalar), whose loss is
``f(w)`` plus the mixture term :func:`mixture_loss` ``f(alpha v + (1 - alpha) stop_grad(w))``: the gradient of
the sum w.r.t. ``w`` is ``grad f(w)`` alone, w.r.t. ``v`` it is ``alpha grad f(v_bar)``, w.r.t. ``alpha`` it is
``<v - w, grad f(v_bar)>``, exactly the three updates above (same step size ``eta``, as in the paper's Alg. 1;
momentum and weight decay, when configured, apply to all three as to any parameter).

Choices where the paper is silent, as options: ``alpha`` (initial mixing weight, default 0.5), ``adaptive``
(False keeps ``alpha`` fixed: APFL with a fixed mixture, the paper's "APFL (alpha = 0.25 / 0.5 / 0.75)" rows;
``alpha = 0`` fixed is FedAvg), ``clip`` (``alpha`` is a mixing weight in ``[0, 1]``; the authors' code
projects it there; here the projection is applied after each round's local training, not per step, since the
step runs inside the spec), ``alpha_reg`` (default 0: a term ``c * alpha_i`` added to ``alpha_i``'s gradient at
every step, the loss term ``c / 2 * alpha_i^2``; the authors' FedTorch ``alpha_update`` and PFLlib's use
``c = 0.02``, which the paper's Eq. 10 does not have; it pulls ``alpha_i`` toward 0 by a factor ``1 - eta c`` per
step). PFLlib's APFL differs from the paper in two more ways, each an option: ``local_loss = "own"`` steps
``v_i`` along its own loss's gradient ``grad f(v_i)`` instead of the mixture's ``alpha_i grad f(v_bar_i)``
(``alpha_i`` keeps Eq. 10's gradient), and ``overwrite`` replaces ``v_i`` by the mixture ``alpha_i v_i + (1 -
alpha_i) w`` (``w`` the client's trained copy) after each round's training, and evaluates ``v_i`` as it is
(PFLlib's ``model_per``; ``[eval] model`` then does not apply). ``alpha_order = "after_steps"`` takes
``alpha_i``'s gradient (still Eq. 10's) on the step's batch at ``v_i`` and ``w`` *after* their steps, as PFLlib's
``alpha_update`` runs after both optimizer steps, and projects ``alpha_i`` after every step (the authors'
code); this is a loop of the method's own (:meth:`APFL.after_steps`, ``Traits.own_loop``), where ``alpha_i``
takes plain SGD steps (no momentum or weight decay of its own). (PFLlib's ``alpha`` gradient is
``<v - w, alpha grad f(v) + (1 - alpha) grad f(w)>``, a linearisation of Eq. 10's; here it stays Eq. 10's.)
``v_i`` starts at the initial model (as ``w``).

Evaluation: the mixture ``alpha_i v_i + (1 - alpha_i) w`` with ``w`` the aggregated global model the client
receives (paper Sec. 3: the personalized model of client ``i`` combines its local model with the global one);
the global model is reported beside it (``[eval] model = "received"``). ``"trained"`` mixes the client's own copy
of ``w`` after its last local training instead (PFLlib's ``model_per``; the received model before a client's
first training). With ``+ala``, ALA initialises the global copy ``w`` from the received model and the client's
last ``w``, as for FedAvg, and ``[eval] model`` is ALA's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.mix import interpolate
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, clone, flatten, unflatten
from fedblend.core.method import ClientCtx, Message, Method, State, Traits
from fedblend.core.optim import SGD
from fedblend.core.template import record_training, train_spec
from fedblend.core.training import Batch, LossTerm, TrainResult, batch_rows, forward

LOCAL = "apfl_v"
ALPHA = "apfl_alpha"


@dataclass(frozen=True)
class APFLOptions:
    CHOICES: ClassVar[dict] = {"local_loss": ("mixture", "own"), "alpha_order": ("simultaneous", "after_steps")}
    RANGES: ClassVar[dict] = {"alpha": "[0, 1]", "alpha_reg": ">= 0"}
    alpha: float = opt(0.5, "initial mixing weight alpha_i of Eq. 3 (the paper does not fix one for adaptive runs)")
    adaptive: bool = opt(True, "learn alpha_i by Eq. 10 (False: alpha stays at its initial value)")
    clip: bool = opt(True, "project alpha_i to [0, 1] after each round's local training (authors' code: per step)")
    alpha_reg: float = opt(0.0, "c of a term c * alpha_i added to alpha_i's gradient at every step (the paper: "
                                "none; the authors' FedTorch code and PFLlib: 0.02)")
    local_loss: str = opt("mixture", "v_i's step: along the mixture's gradient alpha_i grad f(v_bar_i) (\"mixture\": the "
                                     "paper's Alg. 1, the authors' code) or its own loss's grad f(v_i) (\"own\": PFLlib)")
    overwrite: bool = opt(False, "after each round's training v_i <- alpha_i v_i + (1 - alpha_i) w with w the client's "
                                 "trained copy (PFLlib's model_per; the paper and the authors' code keep v_i)")
    alpha_order: str = opt("simultaneous", "alpha_i's gradient at the values before the step, with w's and v_i's "
                                           "(\"simultaneous\": the paper's Alg. 1) or at v_i and w after their steps on "
                                           "the same batch, alpha_i projected per step (\"after_steps\": PFLlib)")


def mix(local: Params, glob: Params, alpha: torch.Tensor | float) -> Params:
    """Eq. 3: ``v_bar = alpha v + (1 - alpha) w`` over ``glob``'s tensors."""
    return interpolate(local, glob, alpha, names=glob)


def mixture_loss(params: Params, batch, names: list[str], own: bool = False) -> torch.Tensor:
    """``f(v_bar)`` on the batch with ``v_bar = alpha v + (1 - alpha) stop_grad(w)``: its gradients are APFL's
    ``v`` and ``alpha`` updates (Alg. 1, Eq. 10) and it adds nothing to ``w``'s (``w`` takes FedAvg's step).
    ``own`` (option ``local_loss = "own"``, PFLlib): ``f(alpha stop_grad(v) + (1 - alpha) stop_grad(w)) + f(v)``,
    so ``alpha`` keeps Eq. 10's gradient and ``v`` takes its own loss's."""
    glob = {n: params[n].detach() for n in names}
    local = unflatten(params[LOCAL], glob)
    if not own:
        return F.cross_entropy(functional_call(batch.model, mix(local, glob, params[ALPHA]), (batch.x,)), batch.y)
    fixed = {n: t.detach() for n, t in local.items()}
    out = functional_call(batch.model, mix(fixed, glob, params[ALPHA]), (batch.x,))
    return F.cross_entropy(out, batch.y) + F.cross_entropy(functional_call(batch.model, local, (batch.x,)), batch.y)


def alpha_penalty(params: Params, batch, coef: float) -> torch.Tensor:
    """``coef / 2 * alpha^2``: adds ``coef * alpha`` to ``alpha``'s gradient (option ``alpha_reg``; the authors'
    FedTorch ``alpha_update`` and PFLlib add ``0.02 * alpha``, the paper's Eq. 10 has no such term)."""
    return 0.5 * coef * params[ALPHA] ** 2


@register_method
class APFL(Method):
    name = "apfl"
    display_name = "APFL"
    options_cls = APFLOptions
    paper = "Deng, Kamani and Mahdavi, Adaptive Personalized Federated Learning, arXiv:2003.13461, 2020"

    def declare(self, choice: str) -> Traits:
        """``w`` restarts from the received model (v_i and alpha_i are kept under "apfl"), so the client keeps no
        model; the global side ``w`` of the mixture is the received global model (as FedAvg). Each client's
        ``alpha_i`` is recorded per round (``stats_per_client``), besides its mean."""
        return Traits(keeps_model=False, evaluates_received_model=True, client_stats=("apfl_alpha",),
                      own_loop=self.opts.alpha_order == "after_steps",
                      eval_model="each client's mixture alpha_i v_i + (1 - alpha_i) w (APFL Eq. 3) of its local "
                                 "model v_i and w = {}")

    def init_client(self, ctx: ClientCtx) -> State:
        alpha = torch.tensor(self.opts.alpha, dtype=torch.float32, device=ctx.run.device)
        return {**super().init_client(ctx), "apfl": {"v": clone(ctx.run.init_params), "alpha": alpha}}

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """One spec updates ``w``, ``v_i`` and (when adaptive) ``alpha_i`` together; ``train_loss`` is ``f(w)``'s."""
        st = cstate["apfl"]
        names = list(params)
        work = {**params, LOCAL: flatten({n: st["v"][n] for n in names}), ALPHA: st["alpha"]}
        trainable = None if self.opts.adaptive else [n for n in work if n != ALPHA]
        own = self.opts.local_loss == "own"
        terms = (LossTerm(mixture_loss, {"names": names, "own": own}, name="apfl_mixture"),)
        if self.opts.adaptive and self.opts.alpha_reg:
            terms += (LossTerm(alpha_penalty, {"coef": self.opts.alpha_reg}, name="apfl_alpha_reg", uses_batch=False),)
        if self.opts.alpha_order == "after_steps":
            yield from ()  # a loop of its own: no spec
            res = self.after_steps(work, names, cstate, ctx)
        else:
            res = yield train_spec(self, work, msg, cstate, ctx, trainable=trainable, loss_terms=terms)
        cstate = record_training(res, cstate, ctx)
        alpha = res.params[ALPHA].clamp(0.0, 1.0) if self.opts.clip else res.params[ALPHA]
        ctx.stats["apfl_alpha"] = float(alpha)
        v = {n: t.clone() for n, t in unflatten(res.params[LOCAL], params).items()}  # own storage, not views
        w = {n: res.params[n] for n in names}
        if self.opts.overwrite:  # PFLlib: model_per <- (1 - alpha) model + alpha model_per after training
            v = {n: t.clone() for n, t in mix(v, w, alpha).items()}
        kept = {"v": v, "alpha": alpha}
        if self.traits.eval_choice == "trained":  # PFLlib's model_per mixes the client's own trained copy
            kept["w"] = {n: t.clone() for n, t in w.items()}
        cstate = {**cstate, "apfl": kept}
        return TrainResult(w, res.momentum, res.mean_loss, res.steps, res.samples), cstate

    def after_steps(self, work: Params, names: list[str], cstate: State, ctx: ClientCtx) -> TrainResult:
        """``alpha_order = "after_steps"`` (PFLlib's ``clientapfl.py``): per batch of the spec path's draws, ``w``'s
        and ``v_i``'s steps as the spec takes them, then ``alpha_i <- alpha_i - eta (<v_i - w, grad f(alpha_i v_i +
        (1 - alpha_i) w)> + alpha_reg alpha_i)`` at the new ``v_i`` and ``w`` on the same batch, projected to [0, 1]
        per step (``clip``). The loss reported is ``f(w)``'s, as the spec path's."""
        cfg, x, y = ctx.train, ctx.data.train_x, ctx.data.train_y
        rows, lens = batch_rows(len(y), cfg.batch_size, cfg.epochs, ctx.tree.torch("batches"), cfg.drop_last,
                              shuffle=cfg.shuffle)
        p = {k: v.detach().clone() for k, v in work.items()}
        if not lens:
            return TrainResult(p, None, float("nan"), 0, 0)
        learn, opt = [*names, LOCAL], SGD(cfg.lr, cfg.momentum, cfg.weight_decay)
        kept = (cstate.get("momentum") or {}) if cfg.optimizer_state == "keep" else {}
        leaves = [p[n].requires_grad_(True) for n in learn]
        bufs = opt.init(leaves, [kept.get(n) for n in learn])
        own, total = self.opts.local_loss == "own", 0.0
        for s, k in enumerate(lens):
            b = Batch(x[rows[s, :k]], y[rows[s, :k]], None, model=ctx.model)
            data_loss = F.cross_entropy(forward(ctx.model, {n: p[n] for n in names}, b.x)[0], b.y)
            loss = data_loss + mixture_loss(p, b, names, own)
            opt.update_(leaves, torch.autograd.grad(loss, leaves), bufs)
            total += float(data_loss.detach()) * k
            if self.opts.adaptive:
                a = p[ALPHA].detach().requires_grad_(True)
                (g,) = torch.autograd.grad(mixture_loss({**p, ALPHA: a}, b, names, own), [a])
                with torch.no_grad():
                    a = a - cfg.lr * (g + self.opts.alpha_reg * a)
                    p[ALPHA] = a.clamp(0.0, 1.0) if self.opts.clip else a
        moms = dict(zip(learn, bufs)) or None
        return TrainResult({k: v.detach() for k, v in p.items()}, moms, total / sum(lens), len(lens), sum(lens))

    def eval_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Eq. 3: ``alpha_i v_i + (1 - alpha_i) w`` with ``w`` the received global model, or, with a transform
        (``+ala``), the global copy as the transform would initialise it; with ``[eval] model = "trained"``,
        ``w`` is the client's own copy after its last local training (PFLlib), the received one before its
        first; with ``overwrite``, ``v_i`` itself (already that mixture, PFLlib's ``model_per``)."""
        st = cstate["apfl"]
        if self.opts.overwrite:  # v_i is already the mixture with the trained copy (PFLlib's model_per)
            return st["v"]
        if "w" in st:
            return mix(st["v"], st["w"], st["alpha"])
        return mix(st["v"], super().eval_params(msg, cstate, ctx), st["alpha"])

    def eval_models(self) -> dict[str, str]:
        """``"received"`` (paper): ``w`` of the mixture is the received global model; ``"trained"``: the client's
        own copy after its last local training (PFLlib's ``model_per``)."""
        return {"received": "the aggregated global model (what each client receives)",
                "trained": "its own copy after its last local training (PFLlib's model_per)"}

