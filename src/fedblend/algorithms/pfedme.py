"""pFedMe (T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020).

Bi-level problem (paper Eq. 2-3): ``min_w 1/N sum_i F_i(w)`` with the Moreau envelope
``F_i(w) = min_theta f_i(theta) + lambda/2 ||theta - w||^2``; the minimiser ``theta_i(w)`` is client ``i``'s
personalized model. Algorithm 1, for each selected client, from the received ``w^t`` (``w_{i,0} = w^t``), for
``r = 0 .. R-1``:

* sample a batch ``D_i`` and solve ``h_i(theta; w_{i,r}, D_i) = f_i(theta; D_i) + lambda/2 ||theta - w_{i,r}||^2``
  approximately (Eq. 7-8): ``K`` gradient steps ``theta <- theta - personal_lr * nabla h_i`` (Sec. 5: "K"
  iterations, "personal learning rate");
* local update (Alg. 1 line 8): ``w_{i,r+1} = w_{i,r} - eta * lambda * (w_{i,r} - theta_i)``, ``eta`` the
  learning rate ``train.lr``.

Server (Alg. 1 line 11): ``w^{t+1} = (1 - beta) w^t + beta * sum_{i in S} (n_i / n_S) w_{i,R}`` (``beta = 1`` is
FedAvg's average of the local models; the paper's average is uniform over ``S``, the authors' code weights it by
data size, as here). Evaluation: the personalized model ``theta_i`` ("pFedMe (PM)" in the paper's tables),
i.e. the inner solution of the client's last local round.

Choices where the paper is silent (options): the inner solver starts each round from ``w^t`` and then warm-starts
from the previous batch's ``theta`` (``inner_init = "previous"``, the authors' code), or from the current
``w_{i,r}`` every time (``"w"``); ``local_steps`` (R) unset = the batches of ``train.epochs`` epochs.
``train.momentum`` / ``weight_decay`` are not used (Algorithm 1 is plain gradient steps). ``personal_lr``
defaults to 0.01 (PFLlib), not the paper's MNIST 0.1: gradient steps on ``h`` are stable only below
``2 / (L_f + lambda)``, and 0.1 with ``lambda = 15`` diverges with the CNNs of our benchmarks (the paper's MNIST
models were a logistic regression and a small MLP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedblend.algorithms.parts.mix import interpolate
from fedblend.algorithms.parts.ownloop import LossFn, OwnLoopMethod, batch_loss, batch_stream, grad, steps_per_epochs
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, ServerCtx, State


@dataclass(frozen=True)
class PFedMeOptions:
    CHOICES: ClassVar[dict] = {"inner_init": ("previous", "w")}
    RANGES: ClassVar[dict] = {"lamda": "> 0", "k": "[1, 10000]", "personal_lr": "> 0", "beta": "> 0",
                              "local_steps": "[1, 1000000]"}

    lamda: float = opt(15.0, "regularisation lambda of the Moreau envelope (paper Sec. 5, MNIST: 15)")
    k: int = opt(5, "inner-solver steps K (Sec. 5: K = 5)")
    personal_lr: float = opt(0.01, "inner-solver step (PFLlib's default; paper's MNIST 0.1 diverges with cnn4, docs)")
    beta: float = opt(1.0, "server mixing beta (Alg. 1 line 11; beta = 1: plain average)")
    inner_init: str = opt("previous", "\"previous\": warm start from the last theta (authors' code); \"w\": from w")
    local_steps: int | None = opt(None, "R; unset = the batches of train.epochs epochs")


def inner_solve(loss: LossFn, theta: Params, w: Mapping, lamda: float, lr: float, steps: int) -> Params:
    """``steps`` gradient steps on ``h(theta) = loss(theta) + lamda/2 ||theta - w||^2`` (Eq. 7) from ``theta``."""
    for _ in range(steps):
        g = grad(loss, theta)
        theta = {k: (theta[k] - lr * (g[k] + lamda * (theta[k] - w[k]))).detach() for k in theta}
    return theta


def local_step(w: Params, theta: Mapping, lamda: float, eta: float) -> Params:
    """Alg. 1 line 8: ``w <- w - eta * lamda * (w - theta)``."""
    return {k: w[k] - eta * lamda * (w[k] - theta[k]) for k in w}


def server_mix(old: Mapping, avg: Mapping, beta: float) -> Params:
    """Alg. 1 line 11: ``(1 - beta) w^t + beta * avg``."""
    return interpolate(avg, old, beta)


@register_method
class PFedMe(OwnLoopMethod):
    name = "pfedme"
    display_name = "pFedMe"
    options_cls = PFedMeOptions
    paper = "T. Dinh et al., Personalized Federated Learning with Moreau Envelopes (pFedMe), NeurIPS 2020"

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's personalized model theta_i (the inner solution of its last local round, "
                           "'pFedMe (PM)'), on its test data"}

    def local_update(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx
                     ) -> tuple[Params, State, float]:
        """Alg. 1 lines 5-9: R rounds of inner solve + local update; keeps ``theta`` in ``cstate["theta"]``."""
        x, y, bs = ctx.data.train_x, ctx.data.train_y, ctx.train.batch_size
        rounds = self.opts.local_steps or steps_per_epochs(len(y), bs, ctx.train.epochs, ctx.train.drop_last)
        if rounds == 0:
            return params, cstate, float("nan")
        stream = batch_stream(len(y), bs, ctx.tree.torch("batches"), ctx.train.drop_last, ctx.train.shuffle)
        w, theta, total = dict(params), dict(params), 0.0
        for _ in range(rounds):
            idx = next(stream)
            f = batch_loss(ctx.model, x[idx], y[idx])
            start = theta if self.opts.inner_init == "previous" else w
            theta = inner_solve(f, start, w, self.opts.lamda, self.opts.personal_lr, self.opts.k)
            total += float(f(theta).detach())
            w = local_step(w, theta, self.opts.lamda, ctx.train.lr)
        return w, {**cstate, "theta": theta}, total / rounds

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Alg. 1 line 11: the data-size-weighted average of the local models, mixed into ``w^t`` by ``beta``."""
        avg = super().aggregate_train(server, replies, sctx)["global"]
        return {**server, "global": server_mix(server["global"], avg, self.opts.beta)}

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """theta_i of the last local round (before its first round: its current model, the initial one)."""
        return cstate.get("theta", cstate["params"])
