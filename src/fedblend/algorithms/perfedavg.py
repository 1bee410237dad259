"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

Objective (paper Eq. 3): ``min_w 1/n sum_i F_i(w)``, ``F_i(w) = f_i(w - alpha nabla f_i(w))`` -- the global model
``w`` is a good starting point for one step of local gradient descent. A selected client runs ``tau`` local
meta-steps from the received ``w`` (Algorithm 1, lines 5-9), each on fresh independent batches ``D, D', D''``::

    w_tilde = w - alpha * nabla f(w; D)                                   (line 6, the temporary model)
    w      <- w - beta * (I - alpha * nabla^2 f(w; D'')) nabla f(w_tilde; D')   (line 7, the MAML step, Eq. 7)

Two variants (Sec. 5, "Implementation"):

* ``"fo"`` (Per-FedAvg (FO)): the Hessian term is dropped, ``w <- w - beta * nabla f(w_tilde; D')`` (Eq. 8);
* ``"hf"`` (Per-FedAvg (HF)): the Hessian-vector product is replaced by the finite difference (Eq. 9)
  ``d = [nabla f(w + delta g; D'') - nabla f(w - delta g; D'')] / (2 delta)`` with ``g = nabla f(w_tilde; D')``,
  and ``w <- w - beta * (g - alpha * d)``.

The server averages the returned models (Algorithm 1, line 11; FedAvg's data-size weights). Evaluation, as the
paper evaluates Per-FedAvg: each client adapts the global model with one step of gradient descent at step size
``alpha`` on a batch of its training data (``w - alpha nabla f(w; D_test-time)``) and is scored on its test data.

Choices where the paper is silent or was not available to us (options): ``alpha = 0.001`` is the small
adaptation step of the paper's experiments as we recall them (not checked against its text here; unset =
``train.lr``, as PFLlib and FL-bench do -- unstable at T3's ``lr = 0.1``); ``beta`` unset uses ``train.lr`` (the
run's client step size; FL-bench and TorchFed default to ``beta = 1e-3``), so ``alpha = 0`` is exactly FedAvg's
SGD step; ``local_steps`` unset runs as many meta-steps as fit in ``train.epochs`` epochs of mini-batches, each
meta-step drawing its 2 (FO) or 3 (HF) batches from that stream. ``train.momentum`` and ``train.weight_decay``
are not used: Algorithm 1 is plain stochastic gradient steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from fedblend.algorithms.parts.ownloop import LossFn, OwnLoopMethod, batch_loss, batch_stream, grad, steps_per_epochs
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State, Traits, train_now
from fedblend.core.training import TrainSpec


@dataclass(frozen=True)
class PerFedAvgOptions:
    CHOICES: ClassVar[dict] = {"variant": ("fo", "hf")}
    RANGES: ClassVar[dict] = {"alpha": ">= 0", "beta": "> 0", "delta": "> 0", "local_steps": "[1, 1000000]"}

    variant: str = opt("fo", '"fo": first-order (Eq. 8); "hf": Hessian-free finite difference (Eq. 9)')
    alpha: float | None = opt(0.001, "inner / adaptation step size (Sec. 5, see docs); unset = train.lr")
    beta: float | None = opt(None, "meta (outer) step size of Algorithm 1 line 7; unset = train.lr")
    delta: float = opt(0.001, "finite-difference radius of the HF variant (FL-bench default 1e-3)")
    local_steps: int | None = opt(None, "tau; unset = the meta-steps that fit in train.epochs epochs of batches")


def meta_step(w: Params, losses: tuple[LossFn, LossFn, LossFn | None], alpha: float, beta: float,
              variant: str = "fo", delta: float = 0.001) -> tuple[Params, float]:
    """One Per-FedAvg local step (Algorithm 1 lines 6-7) with the batch losses ``(f(.; D), f(.; D'), f(.; D''))``
    (the third unused by ``"fo"``). Returns the new ``w`` and ``f(w_tilde; D')``."""
    f_d, f_d1, f_d2 = losses
    g0 = grad(f_d, w)
    w_tilde = {k: w[k] - alpha * g0[k] for k in w}
    g = grad(f_d1, w_tilde)
    loss = float(f_d1(w_tilde).detach())
    if variant == "hf":
        plus = grad(f_d2, {k: w[k] + delta * g[k] for k in w})
        minus = grad(f_d2, {k: w[k] - delta * g[k] for k in w})
        g = {k: g[k] - alpha * (plus[k] - minus[k]) / (2 * delta) for k in w}  # (I - alpha H) g, Eq. 9
    return {k: (w[k] - beta * g[k]).detach() for k in w}, loss


@register_method
class PerFedAvg(OwnLoopMethod):
    name = "perfedavg"
    display_name = "Per-FedAvg"
    options_cls = PerFedAvgOptions
    paper = ("Fallah et al., Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic "
             "Meta-Learning Approach (Per-FedAvg), NeurIPS 2020")

    def declare(self, choice: str) -> Traits:
        return replace(super().declare(choice), keeps_model=False)

    def alpha(self, ctx: ClientCtx) -> float:
        return ctx.train.lr if self.opts.alpha is None else self.opts.alpha

    def local_update(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx
                     ) -> tuple[Params, State, float]:
        """Algorithm 1 lines 5-9: ``tau`` meta-steps on batches from the client's ``batches`` stream."""
        x, y, bs = ctx.data.train_x, ctx.data.train_y, ctx.train.batch_size
        per_step = 3 if self.opts.variant == "hf" else 2
        available = steps_per_epochs(len(y), bs, ctx.train.epochs, ctx.train.drop_last)
        if available == 0:  # no data, or fewer samples than a batch under train.drop_last
            return params, cstate, float("nan")
        tau = self.opts.local_steps or max(1, available // per_step)
        stream = batch_stream(len(y), bs, ctx.tree.torch("batches"), ctx.train.drop_last, ctx.train.shuffle)
        w, total = dict(params), 0.0
        beta = ctx.train.lr if self.opts.beta is None else self.opts.beta
        for _ in range(tau):
            idx = [next(stream) for _ in range(per_step)]
            losses = tuple(batch_loss(ctx.model, x[i], y[i]) for i in idx)
            w, loss = meta_step(w, losses + (None,) * (3 - per_step), self.alpha(ctx), beta, self.opts.variant,
                                self.opts.delta)
            total += loss
        return w, cstate, total / tau

    def eval_models(self) -> dict[str, str]:
        return {"adapted": "the global model after one step of gradient descent (step size alpha) on a batch of "
                           "each client's training data, on that client's test data"}

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The evaluation's one-step adaptation (Sec. 5): one gradient step at ``alpha`` from what the client would
        start from (the received global model) on one training batch from the ``adapt`` stream."""
        start = self.client_init(msg, cstate, ctx)
        return train_now(TrainSpec(params=start, steps=1, lr=self.alpha(ctx), stream="adapt"), ctx).params
