"""The client runtime: runs a method's client half for the clients whose data it holds.

A :class:`ClientJob` is everything one client receives for one exchange: the phase, its id, the round, the
message, and its own state (``None`` at first contact: the client half initialises it, on the client). The
runtime builds the client's :class:`~fedblend.core.method.ClientCtx` from its own data and random streams, runs
the phase and returns a :class:`ClientResult`: the reply message, the new state (``None`` for evaluation,
which never changes state) and the numbers the client reports for the round's metrics.

Training phases are generators (see :mod:`fedblend.core.method`); :func:`drive` runs one to completion, handing
every :class:`~fedblend.core.training.TrainSpec` it yields to an executor. A backend that batches specs across
clients drives several generators in lock-step instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedblend.common.codec import to_device
from fedblend.common.guard import method_guard, returned_wrong
from fedblend.common.params import Params
from fedblend.common.rng import SeedTree
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalSpec, evaluate_params
from fedblend.core.message import Message
from fedblend.core.method import (
    ClientCtx,
    ClientWork,
    Method,
    RunInfo,
    State,
    client_tree,
    same_tensors,
    train_now,
)
from fedblend.core.replies import model_errors
from fedblend.core.returns import returned, returned_result
from fedblend.core.training import TrainResult, TrainSpec
from fedblend.data.federated import ClientData

EVALUATE = "evaluate"


def _eval_hook(method: Method) -> str:
    """The hook a failure of the evaluated model is named after: ``evaluate`` where the method gives its own
    :class:`EvalSpec`, else ``eval_params`` (what a method that scores a plain model overrides)."""
    return "evaluate" if type(method).evaluate is not Method.evaluate else "eval_params"


@dataclass
class ClientJob:
    phase: str  # "train", "evaluate", or a method's own phase
    cid: int
    rnd: int
    msg: Message
    state: State | None  # None: first contact, the client half initialises its state


@dataclass
class ClientResult:
    reply: Message
    state: State | None  # None: unchanged (evaluation)
    stats: dict = field(default_factory=dict)


def drive(work: ClientWork, execute: Callable[[TrainSpec], TrainResult]) -> tuple[Message, State]:
    """Run a client half's generator to the end, executing each spec it yields; return its (reply, state)."""
    try:
        spec = next(work)
        while True:
            spec = work.send(execute(spec))
    except StopIteration as stop:
        return stop.value


def returned_pair(out: Any, method: Method, job: ClientJob) -> tuple[Message, State]:
    """What a client half's ``client_step`` generator returned, checked to be ``(reply Message, state)``: a hook
    that forgot to ``return`` is named here, on the client, not as an AttributeError wherever its reply is first
    touched (:func:`~fedblend.core.returns.returned_result`)."""
    return returned_result(method, "client_step", out, job.rnd, job.cid)


def client_work(method: Method, job: ClientJob, state: State, ctx: ClientCtx) -> ClientWork:
    """The generator of ``method``'s ``client_step`` for ``job`` (guarded, and checked to be a generator)."""
    with method_guard(method, "client_step", job.rnd, job.cid, ctx.model):
        return returned(method, "client_step", method.client_step(job.phase, job.msg, state, ctx), job.rnd, job.cid)


class ClientRuntime:
    """Client halves of one method for the clients in ``data`` (all of them in-process; a worker's own share in
    the process backend; one on a Flower node)."""

    def __init__(self, method: Method, run: RunInfo, data: Mapping[int, ClientData], tree: SeedTree):
        self.method, self.run, self.data, self.tree = method, run, dict(data), tree
        self.caches: dict[int, dict] = {}  # per-client memos (ClientCtx.cache), not state

    def ctx(self, cid: int, rnd: int, phase: str) -> ClientCtx:
        if cid not in self.data:
            raise KeyError(f"client {cid}'s data is not held by this runtime")
        return ClientCtx(cid, rnd, self.data[cid], self.run, client_tree(self.tree, phase, rnd, cid),
                         cache=self.caches.setdefault(cid, {}))

    def handle(self, job: ClientJob) -> ClientResult:
        t0 = time.perf_counter()
        ctx, state = self.begin(job)
        if job.phase == EVALUATE:
            return ClientResult(self.evaluate(job.msg, state, ctx), None, {})
        work = client_work(self.method, job, state, ctx)
        with method_guard(self.method, "client_step", job.rnd, job.cid, self.run.model):
            out = drive(work, lambda s: train_now(s, ctx))
        reply, state = returned_pair(out, self.method, job)
        ctx.stats["client_seconds"] = time.perf_counter() - t0
        return ClientResult(reply, state, ctx.stats)

    def begin(self, job: ClientJob) -> tuple[ClientCtx, State]:
        """The job's client context and the client's state (initialised on the client at first contact): how
        every runtime (this one's :meth:`handle`, the vmap backend's lock-step driver) starts a job."""
        ctx = self.ctx(job.cid, job.rnd, job.phase)
        if job.state is not None:
            return ctx, job.state
        with method_guard(self.method, "init_client", job.rnd, job.cid):
            state = returned(self.method, "init_client", self.method.init_client(ctx), job.rnd, job.cid)
        return ctx, to_device(state, ctx.run.device)

    def eval_models(self, msg: Message, state: State, ctx: ClientCtx) -> tuple[EvalSpec, Params | None, tuple]:
        """The client's personalized model (``method.evaluate``: an :class:`EvalSpec`), the global model if the
        message carries one, and the evaluation data ``(x, y)`` of the split ``msg.config["split"]``."""
        split = msg.config.get("split", "test")
        hook = _eval_hook(self.method)
        with torch.enable_grad(), method_guard(self.method, hook, ctx.rnd, ctx.cid, ctx.model):
            spec = self.method.evaluate(msg, state, ctx)  # (methods may fine-tune or blend before evaluating)
        returned(self.method, "evaluate", spec, ctx.rnd, ctx.cid)
        # a partial or misshapen model would be scored with the model's initial weights filling in (a spec with its
        # own forward may carry more, e.g. DBE's bias: that forward reads what it needs)
        bad = model_errors(spec.params, self.run.init_params) if spec.forward is None else []
        if bad:
            returned_wrong(self.method, "method", hook, "parameters that are not the model's ("
                           + "; ".join(bad) + ")", ctx.rnd, ctx.cid)
        return spec, msg.arrays.get("global"), (getattr(ctx.data, f"{split}_x"), getattr(ctx.data, f"{split}_y"))

    @torch.no_grad()
    def evaluate(self, msg: Message, state: State, ctx: ClientCtx) -> Message:
        """The personalized model and, when the message carries one, the global model, on the client's
        evaluation split: correct, summed loss and count of each."""
        bs = int(msg.config.get("batch_size", 2048))
        spec, glob, (x, y) = self.eval_models(msg, state, ctx)
        with method_guard(self.method, "evaluate", ctx.rnd, ctx.cid, ctx.model):  # (a plug-in model's forward)
            own = evaluate_params(ctx.model, spec, x, y, bs)
            metrics = own.to_metrics()
            if glob is not None:
                same = spec.forward is None and same_tensors(spec.params, glob)
                other = own if same else evaluate_params(ctx.model, glob, x, y, bs)
                metrics.update(other.to_metrics(GLOBAL_PREFIX))
        return Message(metrics=metrics)
