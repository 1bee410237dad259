"""The client template and the helpers a method's hooks call: machinery, not hooks.

:func:`client_train` is the client half of a training exchange, written once and closed: no method re-types it
(``tests/test_contract.py`` checks); methods vary it through the client half's hooks
(:class:`~fedblend.core.method.ClientHalf`)::

    cstate = method.before_training(msg, cstate, ctx)   # hook (PartialFed's strategy)
    params = method.client_init(msg, cstate, ctx)       # hook: received parameters over the client's own
    params, cstate = apply_transforms(...)              # composable client-side parts, e.g. ALA ("fedavg+ala")
    score "bp" on method.scored_params(params, ...)     # under eval.before_after; hook (DBE's bias: an EvalSpec)
    res, cstate = yield from method.local_training(...) # hook: default one train_spec + record_training
    score "ap" on method.scored_params(res.params, ...)
    keep the model (traits.keeps_model), transforms' after_train
    return method.reply(res, msg, cstate, ctx), cstate  # hook: the shared part + num_samples (+ records)

The helpers a method's own hooks use: :func:`train_spec` (the default local SGD spec with the method's loss
terms), :func:`record_training` (momentum kept, ``train_loss`` reported), :func:`report_loss`,
:func:`shared_names` (what travels, per ``Traits.shares``), :func:`train_now` (a spec run at once, e.g.
fine-tuning before evaluation), :func:`eval_params` (the personalized model per ``[eval] model`` with the
transforms on top: what the default ``evaluate`` scores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedblend.common.params import Params
from fedblend.core.context import ClientCtx, ClientWork, RunInfo, State
from fedblend.core.evaluation import EvalSpec, as_eval_spec, evaluate_params
from fedblend.core.message import Message
from fedblend.core.returns import returned, returned_result, transform_returned
from fedblend.core.training import TrainResult, TrainSpec, merge_momentum, run_spec

Method = Any  # a fedblend.core.method.Method (not imported: the method module imports this one)

BEFORE_AFTER = "before_after_split"  # message config key: score the model before ("bp") and after ("ap") training


def client_train(method: Method, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
    """The client half of a training exchange (module docstring): closed, varied only through the hooks, each
    hook's value checked against its contract (:func:`~fedblend.core.returns.returned`)."""
    rnd, cid = ctx.rnd, ctx.cid
    cstate = returned(method, "before_training", method.before_training(msg, cstate, ctx), rnd, cid)
    params = returned(method, "client_init", method.client_init(msg, cstate, ctx), rnd, cid)
    params, cstate = apply_transforms(method, params, cstate, ctx)
    score(method, "bp", params, msg, cstate, ctx)
    work = returned(method, "local_training", method.local_training(params, msg, cstate, ctx), rnd, cid)
    res, cstate = returned_result(method, "local_training", (yield from work), rnd, cid)
    score(method, "ap", res.params, msg, cstate, ctx)
    if method.traits.keeps_model:
        cstate = {**cstate, "params": res.params}
    for t in method.transforms:
        cstate = transform_returned(t, "after_train", t.after_train(method, res.params, cstate, ctx), rnd, cid)
    return returned(method, "reply", method.reply(res, msg, cstate, ctx), rnd, cid), cstate


def apply_transforms(method: Method, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
    """The method's client transforms, in order, on the parameters the client trains from."""
    for t in method.transforms:
        params, cstate = transform_returned(t, "apply", t.apply(method, params, cstate, ctx), ctx.rnd, ctx.cid)
    return params, cstate


def score(method: Method, tag: str, params: Params, msg: Message, cstate: State, ctx: ClientCtx) -> None:
    """Score ``params`` as ``tag`` ("bp" / "ap") when the message asks for it, as the method's ``scored_params``."""
    if msg.config.get(BEFORE_AFTER):
        model = returned(method, "scored_params", method.scored_params(params, msg, cstate, ctx), ctx.rnd, ctx.cid)
        score_before_after(tag, model, msg, ctx)


@torch.no_grad()
def score_before_after(tag: str, params: Params | EvalSpec, msg: Message, ctx: ClientCtx) -> None:
    """When the message asks for it (``config["before_after_split"]``, set by the engine under
    ``eval.before_after``), count the correct predictions of ``params`` on that split of the client's data into
    ``ctx.stats[tag + "_correct"]`` / ``[tag + "_n"]``; the engine pools them into ``{tag}_acc``. ``"bp"``: the
    model a client trains from (received, after transforms), ``"ap"``: after local training (pFedRLLA Table 2)."""
    split = msg.config.get(BEFORE_AFTER)
    if not split:
        return
    x, y = getattr(ctx.data, f"{split}_x"), getattr(ctx.data, f"{split}_y")
    c, _, n = evaluate_params(ctx.model, as_eval_spec(params), x, y)
    ctx.stats[f"{tag}_correct"], ctx.stats[f"{tag}_n"] = c, n


def train_spec(method: Method, params: Params, msg: Message, cstate: State, ctx: ClientCtx, **kw) -> TrainSpec:
    """Local SGD from ``params`` with the configured epochs and lr, the kept momentum buffers when
    ``train.optimizer_state = "keep"``, and the method's ``loss_terms``; ``kw`` overrides spec fields (a stream,
    the trainable tensors, a number of steps)."""
    keep = ctx.train.optimizer_state == "keep"
    spec = dict(params=params, momentum=cstate.get("momentum") if keep else None,
                loss_terms=returned(method, "loss_terms", method.loss_terms(msg, params, cstate, ctx), ctx.rnd, ctx.cid))
    return TrainSpec(**{**spec, **kw})


def record_training(res: TrainResult, cstate: State, ctx: ClientCtx) -> State:
    """After a spec ran: keep the momentum buffers (merged, so untrained tensors keep theirs) and the loss. A
    client that trained no batch (fewer samples than one batch under ``train.drop_last``, as PFLlib's loader
    skips it) reports no ``train_loss``: its loss is undefined, not a divergence."""
    if ctx.train.optimizer_state == "keep" and res.momentum is not None:
        cstate = {**cstate, "momentum": merge_momentum(cstate.get("momentum"), res.momentum)}
    report_loss(ctx, "train_loss", res)
    return cstate


def report_loss(ctx: ClientCtx, key: str, res: TrainResult) -> None:
    """Report a training phase's mean loss as the client stat ``key``, unless the phase trained no batch (fewer
    samples than one batch under ``train.drop_last``; PFLlib's loader skips such a client): its loss is undefined,
    and a NaN would read as a divergence."""
    if res.steps:
        ctx.stats[key] = res.mean_loss


def shared_names(method: Method, run: RunInfo) -> list[str]:
    """The parameters that travel (``Traits.shares``): all of them, the body's, or none (prototype uploads)."""
    shares = method.traits.shares
    if shares == "none":
        return []
    return list(run.init_params) if shares == "all" else run.model.body_names()


def eval_params(method: Method, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
    """Parameters of the client's personalized model, per ``[eval] model`` (``traits.eval_choice``): the method's
    ``personalized_params``, then each transform's ``eval_params`` on top (the default of the ``eval_params``
    hook). A transform that blends the received model (ALA) replaces the method's choice by its own: it is then
    handed what ``client_init`` makes of the evaluation message, as training hands ``apply``. A method whose
    transforms do not change the model evaluated (``Traits.eval_transforms``: Ditto's v_k) is its own."""
    if any(t.traits.requires_received for t in method.transforms) and method.traits.eval_transforms:
        params = returned(method, "client_init", method.client_init(msg, cstate, ctx), ctx.rnd, ctx.cid)
    else:
        params = returned(method, "personalized_params", method.personalized_params(msg, cstate, ctx), ctx.rnd,
                          ctx.cid)
    if not method.traits.eval_transforms:
        return params
    for t in method.transforms:
        params = transform_returned(t, "eval_params", t.eval_params(method, msg, cstate, ctx, params), ctx.rnd,
                                    ctx.cid)
    return params


def train_now(spec: TrainSpec, ctx: ClientCtx) -> TrainResult:
    """Run a spec at once on the client's own data and stream (for evaluation-time work such as fine-tuning,
    which is not part of the round's training)."""
    return run_spec(spec, ctx.model, ctx.data, ctx.train, ctx.tree.torch(spec.stream))


def same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor] | None) -> bool:
    """Whether two parameter dicts hold the very same tensor objects (so evaluating one evaluates both)."""
    return b is not None and a.keys() == b.keys() and all(a[k] is b[k] for k in a)
