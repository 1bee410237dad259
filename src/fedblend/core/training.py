"""Local training as data: a client half describes its training as a :class:`TrainSpec`; a backend runs it.

:func:`sgd_train` runs mini-batch SGD (PyTorch's ``SGD`` update rule, with optional momentum whose buffers are
returned so a method can keep them in the client state) over a parameter dictionary with
``torch.func.functional_call``. Batches come from a passed-in generator (one random permutation per epoch, last
partial batch kept, like ``DataLoader(shuffle=True)``; ``train.drop_last = true`` drops it, like PFLlib's
``DataLoader(shuffle=True, drop_last=True)``; ``train.shuffle = false`` takes every epoch in the data's order, like
PFLlib's FedFomo loader, ``DataLoader(shuffle=False)``).

A spec says *what* to train: start parameters, which tensors move (``trainable``; FedRep / FedBABU phases), how
long (``epochs`` or ``steps``), the learning rate, the optimizer buffers to start from, and extra loss terms.
A :class:`LossTerm` sees the parameters and the :class:`Batch` -- inputs, labels, logits and (when it asks for
them) the model's features -- so proximal (FedProx, Ditto, FedAMP), distillation (FedPHP), representation
(FedProto, FedPAC, DBE) and mixture (APFL) losses all fit. A method whose forward pass differs from the model's
(DBE adds a trained bias to the features before the head) gives a :class:`Forward`, also data. Because the spec is
data, a backend may run a list of them one by one, in worker processes, or batched with ``torch.func.vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedblend.common.params import Params
from fedblend.core.optim import SGD


@dataclass(frozen=True)
class TrainConfig:
    """Client optimiser settings (the ``[train]`` table of a run config)."""

    CHOICES: ClassVar[dict] = {"optimizer_state": ("reset", "keep")}
    RANGES: ClassVar[dict] = {"lr": "> 0", "momentum": "[0, 1)", "weight_decay": ">= 0", "batch_size": "[1, 1000000]",
                              "epochs": "[1, 10000]"}

    #: SGD learning rate
    lr: float = 0.01
    #: SGD momentum
    momentum: float = 0.0
    #: SGD weight decay (L2 penalty)
    weight_decay: float = 0.0
    #: local training mini-batch size
    batch_size: int = 64
    #: local epochs per round
    epochs: int = 1
    #: ``keep``: momentum buffers persist across rounds in the client state (FedAPA's code)
    optimizer_state: str = "reset"
    #: drop each local epoch's last partial batch, as PFLlib's ``DataLoader(drop_last=True)`` (a client with fewer than
    #: ``batch_size`` training samples then does not train); default: kept, ``ceil(n / batch_size)`` steps per epoch
    drop_last: bool = False
    #: ``false``: every local epoch's batches in the client's data order, as PFLlib's FedFomo loader
    #: (``DataLoader(shuffle=False)``); default: a fresh random permutation per epoch
    shuffle: bool = True


@dataclass
class Batch:
    """What a loss term sees for one mini-batch (``features`` only when a term asks for them), and the model
    being trained (for terms that run it on other parameters: APFL's mixture, FedPHP's teacher), so that a
    term's ``args`` stay data."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor | None = None
    model: nn.Module | None = None


@dataclass(frozen=True)
class LossTerm:
    """An extra term of the training loss, ``fn(params, batch, **args) -> scalar``, added to the cross-entropy.

    ``fn`` should be a module-level function and ``args`` its data (tensors, parameter dicts, numbers): a term is
    then plain data that a backend can batch across clients (stacking each client's ``args``) or send to
    another process. ``needs_features`` asks for the body's output in ``batch.features``.
    """

    #: the method hook a failure inside the term is named after (:mod:`fedblend.common.guard`): the one that made it
    guard_hook: ClassVar[str] = "loss_terms"

    fn: Callable[..., torch.Tensor]
    args: dict = field(default_factory=dict)
    needs_features: bool = False
    name: str = "extra"
    uses_batch: bool = True  # False: fn ignores the batch (a pull on the parameters), so padding cannot reach it

    def __call__(self, params: Params, batch: Batch) -> torch.Tensor:
        return self.fn(params, batch, **self.args)


@dataclass(frozen=True)
class Forward:
    """A method's own forward pass for local training, ``fn(model, params, x, with_features, **args) -> (logits,
    features or None)``, in place of :func:`forward`.

    Like a :class:`LossTerm`, ``fn`` should be a module-level function and ``args`` its data, so a spec stays
    data that a backend can send to another process. ``params`` is the whole trained dictionary, so it may hold
    entries that are not model parameters (DBE's representation bias) which ``fn`` consumes; ``features`` are
    what loss terms that ask for features see. Backends that batch clients run specs with their own forward one
    by one.
    """

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    args: dict = field(default_factory=dict)
    name: str = "forward"

    def __call__(self, model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                 with_features: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.fn(model, params, x, with_features, **self.args)


class SpecError(TypeError):
    """A :class:`TrainSpec` field that is not what training needs (parameters that are no dict, loss terms that
    are no sequence of :class:`LossTerm`), refused where the spec is made; ``guard_hook`` names the template hook
    whose value the field is (``client_init``, ``loss_terms``), for :mod:`fedblend.common.guard` to name."""

    def __init__(self, field: str, hook: str, value: object, want: str):
        self.field, self.guard_hook, self.want = field, hook, want
        odd = next((v for v in value if not isinstance(v, LossTerm)), None) if isinstance(value, (tuple, list)) \
            else None
        self.got = ("None (a missing return?)" if value is None else f"a {type(value).__name__}"
                    + ("" if odd is None else f" holding a {type(odd).__name__}"))
        super().__init__(f"TrainSpec.{field} is {self.got}, not {want}")


@dataclass
class TrainSpec:
    """One piece of local training a client half asks its backend to run (see module docstring)."""

    params: Params
    trainable: Sequence[str] | None = None  # None: every tensor in params
    epochs: int | None = None  # None: train.epochs (ignored when steps is set)
    steps: int | None = None  # mini-batch steps instead of epochs (batches keep drawing fresh epochs)
    lr: float | None = None  # None: train.lr
    momentum: Params | None = None  # optimizer buffers to start from (None: fresh)
    loss_terms: tuple[LossTerm, ...] = ()
    stream: str = "batches"  # the client's random stream (in this round) that draws the batches
    split: str = "train"  # the client's data split trained on
    batch_size: int | None = None  # None: train.batch_size
    tags: dict = field(default_factory=dict)  # free-form labels for backends / diagnostics
    forward: Forward | None = None  # None: the model's own forward (:func:`forward`)

    def __post_init__(self) -> None:
        if not isinstance(self.params, Mapping):
            raise SpecError("params", "client_init", self.params, "the parameters to train (a dict of tensors)")
        terms = self.loss_terms
        if not (isinstance(terms, (tuple, list)) and all(isinstance(t, LossTerm) for t in terms)):
            raise SpecError("loss_terms", "loss_terms", terms, "a tuple of LossTerms")


@dataclass
class TrainResult:
    """What running a :class:`TrainSpec` gives: the trained ``params``, the optimiser's ``momentum`` buffers (None without
    momentum), the ``mean_loss`` over its ``steps`` mini-batches and the ``samples`` seen."""

    params: Params
    momentum: Params | None
    mean_loss: float
    steps: int
    samples: int
    #: what a method's ``local_training`` hands its ``reply`` hook besides the trained model (e.g. FedPAC's
    #: statistics of the model it trained from); travels in no message and is never state
    extras: dict = field(default_factory=dict)


def epoch_order(n: int, generator: torch.Generator, shuffle: bool = True) -> torch.Tensor:
    """One local epoch's sample order: a random permutation drawn from ``generator``, or, without ``shuffle``,
    ``0 .. n-1`` (nothing drawn)."""
    return torch.randperm(n, generator=generator) if shuffle else torch.arange(n)


def batches(n: int, batch_size: int, epochs: int, generator: torch.Generator,
            drop_last: bool = False, shuffle: bool = True) -> Iterable[torch.Tensor]:
    """Index batches: a fresh random permutation per epoch (:func:`epoch_order`), last partial batch kept
    (dropped with ``drop_last``: then a client with fewer than ``batch_size`` samples gets no batch, as PFLlib's
    ``drop_last=True`` loader)."""
    for _ in range(epochs):
        perm = epoch_order(n, generator, shuffle)
        if drop_last:
            perm = perm[: n - n % batch_size]
            if not len(perm):
                continue
        yield from torch.split(perm, batch_size)


def batches_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Mini-batches in one pass over ``n`` samples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def forward(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
            with_features: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (and, with ``with_features``, the features before the head) of the model with ``params`` on ``x``:
    the forward pass of every spec without a :class:`Forward` of its own."""
    if not with_features:
        return functional_call(model, params, (x,)), None
    feats = functional_call(model, params, (x,), {"part": "features"})
    return functional_call(model, params, (feats,), {"part": "head"}), feats


def batch_rows(n: int, batch_size: int, epochs: int, generator: torch.Generator, drop_last: bool = False,
               steps: int | None = None, shuffle: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Every index batch of one piece of local training as one ``[steps, batch_size]`` tensor (a partial last
    batch padded with -1) and each step's batch length, drawn up front from the client's stream: one random
    permutation per epoch (:func:`epoch_order`; the batches of :func:`batches`, the same draws); ``epochs`` passes, or the first
    ``steps`` batches of as many passes as they need. No rows when there is nothing to train."""
    per_epoch = batches_per_epoch(n, batch_size, drop_last)
    if steps is not None:
        epochs = math.ceil(steps / per_epoch) if per_epoch else 0
    if per_epoch == 0 or epochs <= 0 or (steps is not None and steps <= 0):
        return torch.empty((0, batch_size), dtype=torch.long), []
    used = n - n % batch_size if drop_last else n  # samples of an epoch that go into a batch
    rows = torch.full((epochs, per_epoch * batch_size), -1, dtype=torch.long)
    for e in range(epochs):
        rows[e, :used] = epoch_order(n, generator, shuffle)[:used]
    lens = ([batch_size] * (used // batch_size) + ([used % batch_size] if used % batch_size else [])) * epochs
    rows = rows.view(epochs * per_epoch, batch_size)
    return (rows[:steps], lens[:steps]) if steps is not None else (rows, lens)


def client_step(loss_fn: Callable, opt: SGD, leaves: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor],
                batch) -> torch.Tensor:
    """The client step, the unit of local training: ``loss_fn(batch) -> (loss to minimise, data loss)``, its
    gradient in ``leaves``, one optimizer update of ``leaves`` and ``bufs`` in place. Returns the data loss,
    detached and on the device (no host synchronisation: drivers read losses once per piece of training).

    Both drivers call it: :func:`sgd_train` with one client's tensors and a plain forward, the ``vmap`` backend
    with tensors stacked over clients and a batched forward whose loss is the sum of the clients' losses (each
    client's gradient is then its own loss's gradient)."""
    total, data_loss = loss_fn(batch)
    opt.update_(leaves, torch.autograd.grad(total, leaves), bufs)
    return data_loss.detach()


def sgd_train(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
              cfg: TrainConfig, generator: torch.Generator, *, momentum: Mapping[str, torch.Tensor] | None = None,
              loss_terms: Sequence[LossTerm] = (), trainable: Iterable[str] | None = None,
              epochs: int | None = None, lr: float | None = None, steps: int | None = None,
              batch_size: int | None = None, forward_fn: Forward | None = None) -> TrainResult:
    """Train ``params`` on ``(x, y)`` with SGD; return new tensors (inputs are not modified).

    :func:`client_step` over :func:`batch_rows`' batches with :class:`~fedblend.core.optim.SGD` (the update of
    ``torch.optim.SGD``). Loss: cross-entropy plus every term of ``loss_terms``. Only buffers of trained tensors
    are returned (a caller merges them into the ones it keeps). ``forward_fn`` replaces the model's forward pass
    (see :class:`Forward`).
    """
    epochs = cfg.epochs if epochs is None else epochs
    bs = cfg.batch_size if batch_size is None else batch_size
    opt = SGD(cfg.lr if lr is None else lr, cfg.momentum, cfg.weight_decay)
    wanted = None if trainable is None else set(trainable)
    names = list(params) if wanted is None else [n for n in params if n in wanted]
    work = {k: v.detach().clone() for k, v in params.items()}
    kept = {k: v for k, v in (momentum or {}).items() if k in names} if cfg.momentum else {}
    rows, lens = batch_rows(len(y), bs, epochs, generator, cfg.drop_last, steps, cfg.shuffle)
    if not lens:
        return TrainResult(_detach(work), {k: v.clone() for k, v in kept.items()} or None, float("nan"), 0, 0)
    leaves = [work[n].requires_grad_(True) for n in names]
    bufs = opt.init(leaves, [kept.get(n) for n in names])
    feats_needed = any(t.needs_features for t in loss_terms)
    fwd = forward if forward_fn is None else forward_fn

    def loss_fn(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xb, yb = x[idx], y[idx]
        out, feats = fwd(model, work, xb, feats_needed)
        loss = F.cross_entropy(out, yb)
        total = loss
        if loss_terms:
            batch = Batch(xb, yb, out, feats, model)
            for term in loss_terms:
                total = total + term(work, batch)
        return total, loss

    rows = rows.to(x.device)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for s, k in enumerate(lens):
        total += client_step(loss_fn, opt, leaves, bufs, rows[s, :k]).double() * k
    return TrainResult(_detach(work), dict(zip(names, bufs)) or None, float(total) / sum(lens), len(lens), sum(lens))


def run_spec(spec: TrainSpec, model: nn.Module, data, cfg: TrainConfig, generator: torch.Generator) -> TrainResult:
    """Run one :class:`TrainSpec` on a client's data (``data.<split>_x / _y``) with the given batch stream."""
    x, y = getattr(data, f"{spec.split}_x"), getattr(data, f"{spec.split}_y")
    return sgd_train(model, spec.params, x, y, cfg, generator, momentum=spec.momentum, loss_terms=spec.loss_terms,
                     trainable=spec.trainable, epochs=spec.epochs, lr=spec.lr, steps=spec.steps,
                     batch_size=spec.batch_size, forward_fn=spec.forward)


def merge_momentum(kept: Mapping[str, torch.Tensor] | None, new: Mapping[str, torch.Tensor] | None) -> Params | None:
    """Buffers after a (possibly partial) training: the new ones over the kept ones, so buffers of tensors that
    were not trained this time survive (FedRep's head and body phases each keep theirs)."""
    if not kept and not new:
        return None
    return {**dict(kept or {}), **dict(new or {})}


def _detach(params: Mapping[str, torch.Tensor]) -> Params:
    return {k: v.detach() for k, v in params.items()}
