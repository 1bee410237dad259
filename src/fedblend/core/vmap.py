"""The ``vmap`` backend: clients whose training specs match train together as one batched computation.

Every client half runs as usual up to the :class:`~fedblend.core.training.TrainSpec` it yields; specs with the
same signature (trainable names, epochs or steps, learning rate, batch size, split, stream, loss terms) are run
as one computation over a stacked client axis: ``torch.func.vmap`` of ``torch.func.grad`` of the loss through
``functional_call``. Clients hold different numbers of samples, so each step pads every client's mini-batch to
the batch size with a mask (the loss is the mean over the real samples) and a client without a batch at that
step is not updated (its parameters and momentum buffers are kept by ``torch.where``). Every client draws its
batches from its own stream exactly as the sequential backend does, so the results agree with it up to
floating-point reassociation (tested within tolerance, not bit for bit).

What cannot be batched runs one by one through the sequential path, with a one-line notice (and counted per
reason in every round's metrics, :meth:`VmapBackend.report`): clients whose work
includes an own loop (``Traits.own_loop``: ALA's weight learning, inner solvers) and specs with loss terms
that look at the batch (only terms with ``uses_batch = False``, such as FedProx's proximal term, are batched)
or that bring their own forward pass (a :class:`~fedblend.core.training.Forward`, e.g. DBE's).
Evaluation is batched across clients where the model allows it: clients whose evaluated model is the same
tensors (FedAvg's global model, every client's ``"global"`` record) are scored in one pass over their
concatenated data, split back per client (:func:`evaluate_shared`); other models are scored per client.
On a CPU this backend mostly shows that batching is exact; its use is a GPU,
where per-client batches of 10-64 leave the device idle.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F

from fedblend.common.guard import method_guard
from fedblend.common.params import Params
from fedblend.core.backend import Backend
from fedblend.core.batched import TWINS, batched_sgd, scalar_args
from fedblend.core.client import EVALUATE, ClientJob, ClientResult, ClientRuntime, client_work, returned_pair
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts, EvalSpec
from fedblend.core.message import Message
from fedblend.core.method import train_now
from fedblend.core.stacked import evaluate_stacked, twin_logits, vmap_logits
from fedblend.core.training import Forward, TrainSpec


def _signature(spec: TrainSpec) -> tuple:
    """Specs with equal signatures can share one batched computation (each client keeps its own data, batches,
    parameters, buffers and tensor arguments; everything else must be equal)."""
    terms = tuple((t.fn, tuple(sorted(t.args)), tuple(sorted(scalar_args(t).items()))) for t in spec.loss_terms)
    return (tuple(spec.params), None if spec.trainable is None else tuple(spec.trainable), spec.epochs, spec.steps,
            spec.lr, spec.batch_size, spec.split, spec.momentum is not None, terms)


def batchable(spec: TrainSpec) -> bool:
    """Loss terms that look at the batch would see the padding, and a method's own :class:`Forward` is not
    batched: those specs run one by one."""
    return spec.forward is None and all(not t.uses_batch for t in spec.loss_terms)


def evaluate_shared(model, params: Params, parts: Sequence[tuple], batch_size: int,
                    forward: Forward | None = None) -> list[tuple[int, float, int]]:
    """``(correct, summed loss, n)`` of one model (``params``, with ``forward``: an
    :class:`~fedblend.core.evaluation.EvalSpec`'s) on each of several clients' data, in one pass over the
    concatenated data (per-sample losses summed per client)."""
    spec = EvalSpec(params, forward)
    if not parts:
        return []
    x = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    ok, losses = [], []
    for i in range(0, len(y), batch_size):
        out = spec.logits(model, x[i : i + batch_size])
        losses.append(F.cross_entropy(out, y[i : i + batch_size], reduction="none").double())
        ok.append(out.argmax(1) == y[i : i + batch_size])
    ok_all = torch.cat(ok) if ok else torch.zeros(0, dtype=torch.bool)
    loss_all = torch.cat(losses) if losses else torch.zeros(0, dtype=torch.float64)
    res, start = [], 0
    for px, _ in parts:
        n = len(px)
        res.append((int(ok_all[start : start + n].sum()), float(loss_all[start : start + n].sum()), n))
        start += n
    return res


class VmapBackend(Backend):
    """Client halves driven in lock-step; same-signature specs trained as one vmapped computation."""

    name = "vmap"

    def __init__(self, stack_eval: bool | None = None):
        #: score the clients' own models stacked (None: on an accelerator only -- on a CPU, stacked grouped
        #: convolutions are slower than one model at a time: T1 FedAPA, LeNet-5, 20 clients, one thread: 3.2 s
        #: stacked against 0.5 s per client)
        self.stack_eval = stack_eval
        self.noticed = False
        self.counts: dict[str, int] = {}  # since the last report: specs batched, and run one by one per reason

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def report(self) -> dict:
        """How the round's training ran (the engine adds it to the round's metrics): ``vmap_batched_specs`` and
        ``vmap_one_by_one_<reason>`` (``own_loop`` clients, specs with a ``batch_term`` or their own ``forward``)."""
        counts, self.counts = self.counts, {}
        return counts

    def start(self, method, run, data, tree) -> None:
        self.method, self.run_info = method, run
        self.runtime = ClientRuntime(method, run, data, tree)

    def _notice(self, why: str) -> None:
        if not self.noticed:
            warnings.warn(f"backend 'vmap': {why}; those clients run one by one", RuntimeWarning, stacklevel=3)
            self.noticed = True

    def run(self, jobs: Sequence[ClientJob]) -> list[ClientResult]:
        out = self._run(jobs)
        for job in jobs:  # clients run in lock-step: every result is in at the end
            self.finished(job)
        return out

    def _run(self, jobs: Sequence[ClientJob]) -> list[ClientResult]:
        self._jobs = jobs
        out: list[ClientResult | None] = [None] * len(jobs)
        evals = [i for i, j in enumerate(jobs) if j.phase == EVALUATE]
        for i, res in zip(evals, self._evaluate([jobs[i] for i in evals])):
            out[i] = res
        if self.method.traits.own_loop:
            self._notice(f"{self.method.label} runs its own loop on the client")
            for i, j in enumerate(jobs):
                if out[i] is None:
                    out[i] = self.runtime.handle(j)
                    self._count("vmap_one_by_one_own_loop")
            return out  # type: ignore[return-value]
        live = {}  # index -> (ctx, generator, pending spec, seconds of this client's work so far)
        for i, job in enumerate(jobs):
            if job.phase == EVALUATE:
                continue
            t0 = time.perf_counter()
            ctx, state = self.runtime.begin(job)
            gen = client_work(self.method, job, state, ctx)
            self._advance(i, ctx, gen, None, time.perf_counter() - t0, live, out, first=True)
        while live:
            groups: dict[tuple, list[int]] = {}
            for i, (ctx, _, spec, _) in live.items():
                with method_guard(self.method, "client_step", ctx.rnd, ctx.cid):  # the spec is the method's
                    key = _signature(spec) if batchable(spec) else ("single", i)
                    groups.setdefault(key, []).append(i)
            for key, idx in groups.items():
                specs = [live[i][2] for i in idx]
                ctxs = [live[i][0] for i in idx]
                if key[0] == "single":  # the sequential path: the term sees the real batch / its forward runs
                    self._notice(f"its own forward ({specs[0].forward.name})" if specs[0].forward
                                 else "a loss term looks at the batch")
                    self._count("vmap_one_by_one_" + ("forward" if specs[0].forward else "batch_term"))
                else:
                    self._count("vmap_batched_specs", len(idx))
                g0 = time.perf_counter()
                # a spec's loss terms and forward are the method's code (and the model's), run here for its clients
                with method_guard(self.method, "client_step", ctxs[0].rnd, [c.cid for c in ctxs], self.run_info.model):
                    if key[0] == "single":
                        res = [train_now(specs[0], ctxs[0])]
                    else:
                        res = batched_sgd(self.run_info.model, specs, [c.data for c in ctxs],
                                          [c.tree.torch(s.stream) for c, s in zip(ctxs, specs)], self.run_info.train)
                share = (time.perf_counter() - g0) / len(idx)  # each client's part of the batched work
                for i, r in zip(idx, res):
                    ctx, gen, _, spent = live.pop(i)
                    self._advance(i, ctx, gen, r, spent + share, live, out)
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _evaluate(self, jobs: Sequence[ClientJob]) -> list[ClientResult]:
        """Every client's personalized (and global) model on its evaluation split: models shared by several
        clients scored in one pass over their data (:func:`evaluate_shared`), the clients' own models stacked
        and scored together (:func:`~fedblend.core.stacked.evaluate_stacked`)."""
        items = []  # (job index, "" or "global_", params, x, y, forward)
        for i, job in enumerate(jobs):
            ctx, state = self.runtime.begin(job)
            spec, glob, (x, y) = self.runtime.eval_models(job.msg, state, ctx)
            items.append((i, "", spec.params, x, y, spec.forward))
            if glob is not None:
                items.append((i, GLOBAL_PREFIX, glob, x, y, None))
        metrics: list[dict] = [{} for _ in jobs]
        groups: dict[tuple, list] = {}
        for item in items:  # a model with its own forward (an EvalSpec's) is scored alone, one by one
            groups.setdefault((id(item[5]), *(id(t) for t in item[2].values())), []).append(item)
        bs = int(jobs[0].msg.config.get("batch_size", 2048)) if jobs else 2048
        # each client's own model (the model's forward): scored stacked
        own = [g[0] for g in groups.values() if len(g) == 1 and g[0][5] is None]
        shapes = {tuple((n, tuple(t.shape)) for n, t in item[2].items()) for item in own}
        stack = self.stack_eval if self.stack_eval is not None else torch.device(self.run_info.device).type != "cpu"
        stacked = own if stack and len(own) > 1 and len(shapes) == 1 else []
        if stacked:
            scores = evaluate_stacked(self._eval_logits(), [(p, x, y) for _, _, p, x, y, _ in stacked], bs)
            for (i, prefix, *_), counts in zip(stacked, scores):
                metrics[i].update(EvalCounts(*counts).to_metrics(prefix))
        for group in groups.values():
            if len(group) == 1 and stacked and group[0] in stacked:
                continue
            scores = evaluate_shared(self.run_info.model, group[0][2], [(x, y) for _, _, _, x, y, _ in group], bs,
                                     group[0][5])
            for (i, prefix, *_), counts in zip(group, scores):
                metrics[i].update(EvalCounts(*counts).to_metrics(prefix))
        return [ClientResult(Message(metrics=m), None, {}) for m in metrics]

    def _eval_logits(self):
        """The stacked twin once training has checked it on this model, else ``vmap`` of the model."""
        model = self.run_info.model
        twin = TWINS.get(model)
        return vmap_logits(model) if twin is None else partial(twin_logits, twin)

    def _advance(self, i, ctx, gen, result, spent, live, out, first: bool = False) -> None:
        """Send the last result into the client's generator; keep its next spec pending, or collect its reply."""
        t0 = time.perf_counter()
        try:
            with method_guard(self.method, "client_step", ctx.rnd, ctx.cid, self.run_info.model):
                spec = next(gen) if first else gen.send(result)
            live[i] = (ctx, gen, spec, spent + time.perf_counter() - t0)
        except StopIteration as stop:
            reply, state = returned_pair(stop.value, self.method, self._jobs[i])
            ctx.stats["client_seconds"] = spent + time.perf_counter() - t0
            out[i] = ClientResult(reply, state, ctx.stats)
