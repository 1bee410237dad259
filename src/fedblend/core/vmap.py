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

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from fedblend.common.params import Params
from fedblend.core.backend import Backend
from fedblend.core.client import EVALUATE, ClientJob, ClientResult, ClientRuntime
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts
from fedblend.core.message import Message
from fedblend.core.method import train_now
from fedblend.core.optim import sgd_direction
from fedblend.core.training import TrainConfig, TrainResult, TrainSpec, batches, batches_per_epoch


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


def batched_sgd(model, specs: Sequence[TrainSpec], datas: Sequence, gens: Sequence[torch.Generator],
                cfg: TrainConfig) -> list[TrainResult]:
    """Run same-signature specs of several clients as one vmapped SGD (same update rule as ``sgd_train``)."""
    first = specs[0]
    epochs = cfg.epochs if first.epochs is None else first.epochs
    lr = cfg.lr if first.lr is None else first.lr
    bs = cfg.batch_size if first.batch_size is None else first.batch_size
    names = list(first.params) if first.trainable is None else [n for n in first.params if n in set(first.trainable)]
    frozen_names = [n for n in first.params if n not in set(names)]
    xs = [getattr(d, f"{first.split}_x") for d in datas]
    ys = [getattr(d, f"{first.split}_y") for d in datas]
    plans = []  # per client: its index batches, drawn as sgd_train draws them
    for _x, y, g in zip(xs, ys, gens):
        n, ep = len(y), epochs
        if first.steps is not None:
            per_epoch = batches_per_epoch(n, bs, cfg.drop_last)
            ep = -(-first.steps // per_epoch) if per_epoch else 0
        plan = list(batches(n, bs, ep, g, cfg.drop_last)) if n and ep > 0 else []
        plans.append(plan[: first.steps] if first.steps is not None else plan)
    C, S = len(specs), max((len(p) for p in plans), default=0)
    train = {n: torch.stack([s.params[n].detach() for s in specs]).clone() for n in names}
    frozen = {n: torch.stack([s.params[n].detach() for s in specs]) for n in frozen_names}
    use_mom = bool(cfg.momentum)
    bufs = {n: torch.zeros_like(train[n]) for n in names} if use_mom else {}
    has_buf = {n: torch.zeros(C, dtype=torch.bool, device=train[n].device) for n in names}  # per client, tensor
    if use_mom:
        for c, spec in enumerate(specs):  # kept buffers of the trained tensors (others start fresh, as sgd_train)
            for n in names:
                if spec.momentum is not None and n in spec.momentum:
                    bufs[n][c] = spec.momentum[n]
                    has_buf[n][c] = True
    term_args = [_tensor_args(t, specs, i) for i, t in enumerate(first.loss_terms)]
    term_scalars = [_scalars(t) for t in first.loss_terms]

    def loss_fn(p, fz, x, y, mask, targs):
        out = functional_call(model, {**fz, **p}, (x,))
        per = F.cross_entropy(out, y, reduction="none")
        loss = (per * mask).sum() / mask.sum().clamp_min(1.0)
        total = loss
        for t, ta, sc in zip(first.loss_terms, targs, term_scalars):
            total = total + t.fn({**fz, **p}, None, **ta, **sc)
        return total, loss

    step = vmap(grad(loss_fn, has_aux=True), in_dims=(0, 0, 0, 0, 0, 0))
    totals = torch.zeros(C, dtype=torch.float64)
    seen = torch.zeros(C, dtype=torch.long)
    done = torch.zeros(C, dtype=torch.long)
    x_shape, dev = xs[0].shape[1:], xs[0].device
    for s in range(S):
        active = torch.tensor([s < len(p) for p in plans])
        xb = torch.zeros((C, bs) + tuple(x_shape), dtype=xs[0].dtype, device=dev)
        yb = torch.zeros((C, bs), dtype=ys[0].dtype, device=dev)
        mask = torch.zeros((C, bs), device=dev)
        for c, plan in enumerate(plans):
            if s < len(plan):
                idx = plan[s]
                xb[c, : len(idx)], yb[c, : len(idx)], mask[c, : len(idx)] = xs[c][idx], ys[c][idx], 1.0
        grads, losses = step(train, frozen, xb, yb, mask, term_args)
        with torch.no_grad():
            act = active.to(dev)
            for n in names:
                shape = (C,) + (1,) * (train[n].dim() - 1)
                a = act.view(shape)
                g = sgd_direction(grads[n], train[n], bufs.get(n), cfg.momentum, cfg.weight_decay,
                                  ~has_buf[n].view(shape))
                if use_mom:
                    bufs[n] = torch.where(a, g, bufs[n])
                    has_buf[n] |= act
                train[n] = torch.where(a, train[n] - lr * g, train[n])
            sizes = mask.sum(1).double().cpu()
            totals += losses.detach().double().cpu() * sizes
            seen += sizes.long()
            done += active.long()
    results = []
    for c, spec in enumerate(specs):
        params = {n: (train[n][c] if n in train else spec.params[n].detach()) for n in spec.params}
        mom = ({n: bufs[n][c] for n in names if bool(has_buf[n][c])} or None) if use_mom else None
        k = int(seen[c])
        results.append(TrainResult(params, mom, float(totals[c] / max(k, 1)) if k else float("nan"), int(done[c]), k))
    return results


def evaluate_shared(model, params: Params, parts: Sequence[tuple], batch_size: int) -> list[tuple[int, float, int]]:
    """``(correct, summed loss, n)`` of one model on each of several clients' data, in one pass over the
    concatenated data (per-sample losses summed per client)."""
    if not parts:
        return []
    x = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    ok, losses = [], []
    for i in range(0, len(y), batch_size):
        out = functional_call(model, dict(params), (x[i : i + batch_size],))
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

    def __init__(self):
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
            gen = self.method.client_step(job.phase, job.msg, state, ctx)
            self._advance(i, ctx, gen, None, time.perf_counter() - t0, live, out, first=True)
        while live:
            groups: dict[tuple, list[int]] = {}
            for i, (_, _, spec, _) in live.items():
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
        """Every client's personalized (and global) model on its evaluation split; models shared by several
        clients are scored in one pass."""
        items = []  # (job index, "" or "global_", params, x, y)
        for i, job in enumerate(jobs):
            ctx, state = self.runtime.begin(job)
            params, glob, (x, y) = self.runtime.eval_models(job.msg, state, ctx)
            items.append((i, "", params, x, y))
            if glob is not None:
                items.append((i, GLOBAL_PREFIX, glob, x, y))
        metrics: list[dict] = [{} for _ in jobs]
        groups: dict[tuple, list] = {}
        for item in items:
            groups.setdefault(tuple(id(t) for t in item[2].values()), []).append(item)
        bs = int(jobs[0].msg.config.get("batch_size", 2048)) if jobs else 2048
        for group in groups.values():
            scores = evaluate_shared(self.run_info.model, group[0][2], [(x, y) for _, _, _, x, y in group], bs)
            for (i, prefix, _, _, _), counts in zip(group, scores):
                metrics[i].update(EvalCounts(*counts).to_metrics(prefix))
        return [ClientResult(Message(metrics=m), None, {}) for m in metrics]

    def _advance(self, i, ctx, gen, result, spent, live, out, first: bool = False) -> None:
        """Send the last result into the client's generator; keep its next spec pending, or collect its reply."""
        t0 = time.perf_counter()
        try:
            spec = next(gen) if first else gen.send(result)
            live[i] = (ctx, gen, spec, spent + time.perf_counter() - t0)
        except StopIteration as stop:
            reply, state = stop.value
            ctx.stats["client_seconds"] = spent + time.perf_counter() - t0
            out[i] = ClientResult(reply, state, ctx.stats)
