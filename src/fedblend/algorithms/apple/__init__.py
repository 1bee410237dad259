"""APPLE (Luo & Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning", IJCAI 2022).

Every client ``i`` owns a *core* model ``c_i`` (uploaded each round) and a directed-relationship (DR) vector
``p_i`` over all ``M`` clients (kept private). It downloads every client's core; its personalized model is the
mixture (paper Eq. 2)::

    w_i = sum_j p_ij c_j

and, per mini-batch, it recomputes ``w_i`` and takes a gradient step on its own core and on its DR vector
(Eq. 3-5; the other clients' cores are frozen)::

    c_i  <- c_i  - eta1 * dL/dc_i           dL/dc_i  = p_ii * dCE/dw_i
    p_ij <- p_ij - eta2 * (dL/dp_ij)        dL/dp_ij = <dCE/dw_i, c_j> + lambda(t) mu (p_ij - p0_ij)

with the proximal prior ``p0_i`` (data-size proportions of the clients, Sec. 4) pulled in by a coefficient that
decays over the first ``L`` rounds (the paper's loss scheduler, ``cos``: ``lambda(t) = (cos(pi t / L) + 1) / 2``
for ``t < L``, then 0; ``linear``: ``1 - t / L``), so clients first stay near the prior and later learn their
relations freely. The gradients are exact (autograd through the mixture); PFLlib approximates ``dL/dp_ij`` by the
mean over tensors of the element-wise mean of grad x core (option ``dr_grad = "mean"``) and uploads the mixture
instead of the core (``upload = "mixture"``); the defaults follow the paper.

Choices where the paper is silent (``docs/methods/apple.md``): the DR vector starts uniform ``1/M`` (PFLlib);
the prior uses the data sizes the server has learned from the replies (clients not heard from yet count with the
mean known size, so the first prior is uniform); the core's learning rate is ``train.lr * core_lr_scale``
(``None``: ``M``, as PFLlib, which offsets the ``p_ii ~ 1/M`` factor of its gradient); the core and DR updates are
plain SGD (PFLlib's manual steps; ``train.momentum`` is not used; option ``momentum``: the authors' SGD with
momentum, :mod:`fedblend.algorithms.apple.step`); the personalized model evaluated is the mixture after the
client's last step. Defaults ``eta2 = 0.01``, ``mu = 0.1``, ``L = 0.2`` (of the rounds): FedALA's tuned values
(appendix).

Communication: down, every client's core (``M`` models: APPLE's known cost) and the prior; up, the own core.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.apple.step import apple_step, mixture, stacked64
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, clone, stack_copies, with_rows
from fedblend.core.method import ClientCtx, Message, Method, ServerCtx, State, Traits
from fedblend.core.training import TrainResult, batches


@dataclass(frozen=True)
class APPLEOptions:
    """APPLE options; defaults are FedALA's tuned values (appendix) for the paper's hyperparameters."""

    CHOICES: ClassVar[dict] = {"schedule": ("cos", "linear"), "dr_grad": ("exact", "mean"), "upload": ("core", "mixture")}
    RANGES: ClassVar[dict] = {"dr_lr": ">= 0", "mu": ">= 0", "L": "[0, 1]", "core_lr_scale": "> 0", "momentum": "[0, 1)"}

    dr_lr: float = opt(0.01, "eta2: learning rate of the DR vector")
    mu: float = opt(0.1, "weight of the proximal prior term")
    L: float = opt(0.2, "the prior's coefficient decays to 0 over the first L x rounds")
    schedule: str = opt("cos", "loss scheduler of lambda(t): \"cos\" (FedALA's setting) or \"linear\"")
    core_lr_scale: float | None = opt(None, "core lr = train.lr * this; None: the number of clients (PFLlib)")
    dr_grad: str = opt("exact", '"exact": dL/dp_ij = <dCE/dw_i, c_j> (Eq. 5, the paper); "mean": PFLlib\'s stand-in, '
                       "the mean over parameter tensors of the element-wise mean of dCE/dw_i x c_j")
    upload: str = opt("core", '"core": the client uploads its trained core (the paper); "mixture": its personalized '
                      "mixture, which is then also its own core next round (PFLlib's model_c)")
    momentum: float = opt(0.0, "momentum of the SGD steps on the own core and the DR vector (torch.optim.SGD's, its "
                          "buffers made anew each round); 0: plain steps (Eq. 3-4, PFLlib); the authors' code: 0.9")


# ------------------------------------------------------------------------------------------------ pure parts
def prior_weight(rnd: int, decay_rounds: float, schedule: str = "cos") -> float:
    """``lambda(t)`` of the proximal prior in round ``rnd`` (0-based): decays from 1 to 0 over ``decay_rounds``."""
    if rnd >= decay_rounds:
        return 0.0
    if schedule == "cos":
        return (math.cos(math.pi * rnd / decay_rounds) + 1.0) / 2.0
    return 1.0 - rnd / decay_rounds


def data_prior(sizes: torch.Tensor) -> torch.Tensor:
    """``p0_j = n_j / sum n``; clients with unknown size (0) count with the mean known size (uniform if none)."""
    sizes = sizes.to(torch.float64)
    known = sizes > 0
    fill = sizes[known].mean() if bool(known.any()) else sizes.new_tensor(1.0)
    full = torch.where(known, sizes, fill)
    return full / full.sum()


def core_record(j: int) -> str:
    return f"core_{j}"


# ------------------------------------------------------------------------------------------------ the method
@register_method
class APPLE(Method):
    name = "apple"
    display_name = "APPLE"
    options_cls = APPLEOptions
    paper = "Luo & Wu, Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning, IJCAI 2022"

    def declare(self, choice: str) -> Traits:
        """No global model; the client evaluates its own mixture; its update is a loop of its own. It trains its
        core and DR vector through a mixture of every client's core: a transform's change of the model it starts
        from would be ignored, so transforms are refused."""
        return Traits(global_model=False, evaluates_own_model=True, own_loop=True, accepts_transforms=False)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's mixture of cores by its DR vector after its last local step (Eq. 2)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """Every stored core starts at the common initial model; sizes are learned from the replies."""
        m = sctx.run.num_clients
        return {"cores": stack_copies(sctx.run.init_params, m),
                "sizes": torch.zeros(m, dtype=torch.float64, device=sctx.run.device)}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """Every client's core (one record each) and the prior p0."""
        m = sctx.run.num_clients
        arrays = {core_record(j): {n: t[j] for n, t in server["cores"].items()} for j in range(m)}
        arrays["prior"] = {"p0": data_prior(server["sizes"]).float()}
        return Message(arrays)

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Store every upload as that client's core, and its data size (for the prior)."""
        sizes = server["sizes"].clone()
        for cid, r in replies.items():
            sizes[cid] = float(r.metrics["num_samples"])
        return {**server, "cores": with_rows(server["cores"], {c: r.params() for c, r in replies.items()}),
                "sizes": sizes}

    # ------------------------------------------------------------------------------------------ client
    def init_client(self, ctx: ClientCtx) -> State:
        m = ctx.run.num_clients
        dtype = next(iter(ctx.run.init_params.values())).dtype
        return {"core": clone(ctx.run.init_params), "params": clone(ctx.run.init_params),
                "dr": torch.full((m,), 1.0 / m, dtype=dtype, device=ctx.run.device)}

    @staticmethod
    def received_cores(msg: Message, ctx: ClientCtx) -> dict[str, torch.Tensor]:
        """Every client's core as received, stacked over clients."""
        m = ctx.run.num_clients
        return {n: torch.stack([msg.params(core_record(j))[n] for j in range(m)]) for n in ctx.run.init_params}

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The model the client trains from: its mixture (Eq. 2) of the received cores, its own core in its row."""
        cores, cid = self.received_cores(msg, ctx), ctx.cid
        own = cstate["core"]
        return mixture(cstate["dr"], {n: torch.cat([c[:cid], own[n].unsqueeze(0), c[cid + 1 :]]) for n, c in cores.items()})

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Local epochs of :func:`apple_step` on the client's batches (plain code: an own loop) on the own core and
        the DR vector, through the mixture; the result is the mixture after the last step."""
        yield from ()
        m, cid, cfg = ctx.run.num_clients, ctx.cid, ctx.train
        names = list(ctx.run.init_params)
        cores = self.received_cores(msg, ctx)
        prior = msg.params("prior")["p0"]
        own, dr = cstate["core"], cstate["dr"]
        core_lr = cfg.lr * (m if self.opts.core_lr_scale is None else self.opts.core_lr_scale)
        lam_mu = prior_weight(ctx.rnd, self.opts.L * ctx.run.rounds, self.opts.schedule) * self.opts.mu
        x, y = ctx.data.train_x, ctx.data.train_y
        total, seen, steps = 0.0, 0, 0
        buffer64, velocity = stacked64(cores), {}
        for idx in batches(len(y), cfg.batch_size, cfg.epochs, ctx.tree.torch("batches"), cfg.drop_last, cfg.shuffle):
            own, dr, loss = apple_step(ctx.model, own, cid, cores, dr, prior, x[idx], y[idx], core_lr,
                                       self.opts.dr_lr, lam_mu, buffer64, self.opts.dr_grad, self.opts.momentum,
                                       velocity)
            total += loss * len(idx)
            seen += len(idx)
            steps += 1
        ctx.stats["train_loss"] = total / max(seen, 1)
        cores = {n: torch.cat([cores[n][:cid], own[n].unsqueeze(0), cores[n][cid + 1 :]]) for n in names}
        personal = mixture(dr, cores)
        if self.opts.upload == "mixture":  # PFLlib: the mixture is uploaded and is the client's core from now on
            own = clone(personal)
        return TrainResult(personal, None, ctx.stats["train_loss"], steps, seen), {**cstate, "core": own, "dr": dr}

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The own core (the paper: not the mixture, which is the client's personalized model, kept in its state;
        with ``upload = "mixture"`` the core was replaced by the mixture)."""
        return Message({"params": cstate["core"]}, {"num_samples": ctx.data.num_train})
