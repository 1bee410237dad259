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
import weakref
from collections.abc import Sequence
from functools import partial
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch.func import vmap

from fedblend.common.guard import method_guard
from fedblend.common.params import Params
from fedblend.core.backend import Backend
from fedblend.core.client import EVALUATE, ClientJob, ClientResult, ClientRuntime, returned_pair
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts, EvalSpec
from fedblend.core.message import Message
from fedblend.core.method import train_now
from fedblend.core.optim import SGD
from fedblend.core.stacked import evaluate_stacked, from_native, stacked_twin, to_native, twin_agrees, twin_logits, vmap_logits
from fedblend.core.training import Forward, TrainConfig, TrainResult, TrainSpec, batch_rows, client_step


def _scalars(term) -> dict:
    return {k: v for k, v in term.args.items() if not torch.is_tensor(v) and not isinstance(v, dict)}


def _signature(spec: TrainSpec) -> tuple:
    """Specs with equal signatures can share one batched computation (each client keeps its own data, batches,
    parameters, buffers and tensor arguments; everything else must be equal)."""
    terms = tuple((t.fn, tuple(sorted(t.args)), tuple(sorted(_scalars(t).items()))) for t in spec.loss_terms)
    return (tuple(spec.params), None if spec.trainable is None else tuple(spec.trainable), spec.epochs, spec.steps,
            spec.lr, spec.batch_size, spec.split, spec.momentum is not None, terms)


def batchable(spec: TrainSpec) -> bool:
    """Loss terms that look at the batch would see the padding, and a method's own :class:`Forward` is not
    batched: those specs run one by one."""
    return spec.forward is None and all(not t.uses_batch for t in spec.loss_terms)


def _stack(dicts: Sequence[Params]) -> Params:
    return {k: torch.stack([d[k] for d in dicts]) for k in dicts[0]}


def _tensor_args(term, specs: Sequence[TrainSpec], i: int) -> dict:
    """The term's tensor (and parameter-dict) arguments of every client, stacked on a leading client axis."""
    out = {}
    for k, v in specs[0].loss_terms[i].args.items():
        vals = [s.loss_terms[i].args[k] for s in specs]
        if torch.is_tensor(v):
            out[k] = torch.stack(vals)
        elif isinstance(v, dict):
            out[k] = _stack(vals)
    return out


#: the batches of at most this many bytes are gathered at once (a chunk of steps; every step at least)
GATHER_BYTES = 256 * 2**20


def _stacked_rows(rows: Sequence[torch.Tensor], offsets: Sequence[int], device) -> torch.Tensor:
    """The clients' :func:`~fedblend.core.training.batch_rows` as one ``[steps, clients, bs]`` tensor of rows of
    the concatenated data (client ``c``'s rows shifted by ``offsets[c]``); padding -1 (clients that stop
    earlier than the longest one: its ``rows`` come first, the list sorted by length)."""
    S = rows[0].shape[0] if rows else 0
    idx = torch.full((len(rows), S, rows[0].shape[1] if rows else 0), -1, dtype=torch.long)
    for c, (r, off) in enumerate(zip(rows, offsets)):
        idx[c, : r.shape[0]] = torch.where(r >= 0, r + off, r)
    return idx.transpose(0, 1).contiguous().to(device)


def _rows(args: dict, k: int) -> dict:
    """The first ``k`` clients' entries of stacked term arguments (tensors, or dicts of tensors)."""
    return {a: ({n: t[:k] for n, t in v.items()} if isinstance(v, dict) else v[:k]) for a, v in args.items()}


#: model -> its stacked twin once checked against vmap (None: vmap), see :mod:`fedblend.core.stacked`
_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _gather(X: torch.Tensor, Y: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``X[rows], Y[rows]`` as row copies (``index_select``: 3x faster on a CPU than advanced indexing)."""
    flat = rows.flatten()
    return (X.index_select(0, flat).view(*rows.shape, *X.shape[1:]), Y.index_select(0, flat).view(rows.shape))


def _twin(model, params: Params, x: torch.Tensor):
    """The model's stacked twin, checked against ``vmap`` on its first stacked batch (once per model: the verdict
    is kept), or None: the model has none, or a forward that mixes samples (see :mod:`fedblend.core.stacked`)."""
    if model not in _TWINS:
        twin = stacked_twin(model)
        if twin is not None and not twin_agrees(model, twin, {n: v.detach() for n, v in params.items()}, x):
            warnings.warn(f"backend 'vmap': the stacked form of {type(model).__name__} disagrees with vmap on a "
                          f"batch (its forward mixes samples?); training it through vmap", RuntimeWarning, stacklevel=3)
            twin = None
        _TWINS[model] = twin
    return _TWINS[model]


def batched_sgd(model, specs: Sequence[TrainSpec], datas: Sequence, gens: Sequence[torch.Generator],
                cfg: TrainConfig) -> list[TrainResult]:
    """Run same-signature specs of several clients as one batched SGD: :func:`~fedblend.core.training.client_step`
    on parameters and momentum buffers stacked over clients (one :class:`~fedblend.core.optim.SGD`, as
    ``sgd_train``), the forward through the model's stacked twin (:mod:`fedblend.core.stacked`; in its own layout
    when no loss term reads the parameters) or ``vmap``-ed over the clients, each client's mean loss over its real
    samples.

    Every client draws its batches from its own stream as ``sgd_train`` does; clients are ordered by their number
    of steps, so the ones still training at a step are a prefix of the stack, trained through views of it (no
    masking of updates). The batches of every step are gathered on the device from one index tensor, losses
    stay on the device until the end: nothing per step depends on the number of clients or reads back to the
    host."""
    first = specs[0]
    epochs = cfg.epochs if first.epochs is None else first.epochs
    bs = cfg.batch_size if first.batch_size is None else first.batch_size
    opt = SGD(cfg.lr if first.lr is None else first.lr, cfg.momentum, cfg.weight_decay)
    names = list(first.params) if first.trainable is None else [n for n in first.params if n in set(first.trainable)]
    xs = [getattr(d, f"{first.split}_x") for d in datas]
    ys = [getattr(d, f"{first.split}_y") for d in datas]
    plans = [batch_rows(len(y), bs, epochs, g, cfg.drop_last, first.steps) for y, g in zip(ys, gens)]
    order = sorted(range(len(specs)), key=lambda c: -len(plans[c][1]))  # stable: equal lengths keep client order
    dev = xs[0].device
    offsets = list(accumulate([len(ys[c]) for c in order], initial=0))
    idx = _stacked_rows([plans[c][0] for c in order], offsets, dev)
    S, C = idx.shape[0], len(order)
    active = (torch.tensor([len(plans[c][1]) for c in order]) > torch.arange(S)[:, None]).sum(1).tolist()
    real = idx >= 0
    counts = real.sum(-1)  # [steps, clients]: each client's batch length at each step
    w = real / counts.clamp_min(1).unsqueeze(-1)  # each sample's weight in its client's mean loss
    idx = idx.clamp_min(0)
    X, Y = torch.cat([xs[c] for c in order]), torch.cat([ys[c] for c in order])
    chunk = max(1, GATHER_BYTES // max(1, C * bs * X[:1].nbytes))
    stack = {n: torch.stack([specs[c].params[n].detach() for c in order]).clone() for n in first.params}
    kept = [[(specs[c].momentum or {}).get(n) if opt.momentum else None for c in order] for n in names]
    bufs = [torch.stack([torch.zeros_like(stack[n][0]) if k is None else k.to(stack[n]) for k in ks])
            for n, ks in zip(names, kept)] if opt.momentum else []
    term_args = [_tensor_args(t, [specs[c] for c in order], i) for i, t in enumerate(first.loss_terms)]
    term_scalars = [_scalars(t) for t in first.loss_terms]
    xb, yb = _gather(X, Y, idx[:chunk]) if S else (None, None)
    twin = _twin(model, {n: v[: active[0]] for n, v in stack.items()}, xb[0, : active[0]]) if S else None
    native = twin is not None and not first.loss_terms  # terms see parameters in the model's layout
    if native:  # linear weights transposed: their gradients come out contiguous (a faster update)
        bufs = [b.transpose(1, 2).contiguous() if n in twin.native else b for n, b in zip(names, bufs)]
        stack = to_native(twin, stack)
    logits = vmap_logits(model) if twin is None else partial(twin_logits, twin, native=native)
    terms = [vmap(lambda p, ta, t=t, sc=sc: t.fn(p, None, **ta, **sc)) for t, sc in zip(first.loss_terms, term_scalars)]
    losses = torch.zeros((S, C), device=dev)  # each client's mean batch loss at each step
    for s, k in enumerate(active):
        if s % chunk == 0 and s:  # the next chunk of steps' batches, gathered at once
            xb, yb = _gather(X, Y, idx[s : s + chunk])
        work = {n: v[:k] for n, v in stack.items()}
        leaves = [work[n].detach().requires_grad_(True) for n in names]  # views: updates land in the stack
        work.update(zip(names, leaves))

        def loss_fn(j: int, work=work, k=k, s=s, xb=xb, yb=yb) -> tuple[torch.Tensor, torch.Tensor]:
            out = logits(work, xb[j, :k])
            per = F.cross_entropy(out.flatten(0, 1), yb[j, :k].flatten(), reduction="none").view(k, -1)
            loss = (per * w[s, :k]).sum(1)  # each client's mean loss over its real samples
            total = loss.sum()
            for term, ta in zip(terms, term_args):
                total = total + term(work, _rows(ta, k)).sum()
            return total, loss

        losses[s, :k] = client_step(loss_fn, opt, leaves, [b[:k] for b in bufs], s % chunk)
    if twin is not None:  # the twin keeps no tensors of this call
        twin.feed.clear()
        twin.feed["native"] = False
    if native:
        stack = from_native(twin, stack)
        bufs = [b.transpose(1, 2).contiguous() if n in twin.native else b for n, b in zip(names, bufs)]
    steps = [len(plans[c][1]) for c in order]
    seen = [sum(plans[c][1]) for c in order]
    totals = (losses.double() * counts).sum(0).tolist()
    results: list[TrainResult | None] = [None] * C
    for j, c in enumerate(order):
        spec = specs[c]
        params = {n: (stack[n][j] if n in names else spec.params[n].detach()) for n in spec.params}
        if not opt.momentum:
            mom = None
        elif steps[j]:
            mom = {n: b[j] for n, b in zip(names, bufs)}
        else:
            mom = {n: kept[i][j].clone() for i, n in enumerate(names) if kept[i][j] is not None} or None
        results[c] = TrainResult(params, mom, totals[j] / seen[j] if seen[j] else float("nan"), steps[j], seen[j])
    return results  # type: ignore[return-value]


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
            with method_guard(self.method, "client_step", job.rnd, job.cid):
                gen = self.method.client_step(job.phase, job.msg, state, ctx)
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
        twin = _TWINS.get(model)
        return vmap_logits(model) if twin is None else partial(twin_logits, twin)

    def _advance(self, i, ctx, gen, result, spent, live, out, first: bool = False) -> None:
        """Send the last result into the client's generator; keep its next spec pending, or collect its reply."""
        t0 = time.perf_counter()
        try:
            with method_guard(self.method, "client_step", ctx.rnd, ctx.cid, self.run_info.model):
                spec = next(gen) if first else gen.send(result)
            live[i] = (ctx, gen, spec, spent + time.perf_counter() - t0)
        except StopIteration as stop:
            reply, state = returned_pair(stop.value, self.method.label, self._jobs[i])
            ctx.stats["client_seconds"] = spent + time.perf_counter() - t0
            out[i] = ClientResult(reply, state, ctx.stats)
