"""One SGD over stacked clients (the ``vmap`` backend's training, :mod:`fedblend.core.vmap`): same-signature specs
of several clients trained as one computation, the forward through the model's stacked twin
(:mod:`fedblend.core.stacked`) or ``torch.func.vmap``; each client draws its batches from its own stream exactly as
the sequential backend does."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch.func import vmap

from fedblend.common.params import Params
from fedblend.core.optim import SGD
from fedblend.core.stacked import from_native, stacked_twin, to_native, twin_agrees, twin_logits, vmap_logits
from fedblend.core.training import TrainConfig, TrainResult, TrainSpec, batch_rows, client_step


def scalar_args(term) -> dict:
    """A loss term's arguments that are neither tensors nor parameter dicts (equal for every client of a batch)."""
    return {k: v for k, v in term.args.items() if not torch.is_tensor(v) and not isinstance(v, dict)}


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
TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _gather(X: torch.Tensor, Y: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``X[rows], Y[rows]`` as row copies (``index_select``: 3x faster on a CPU than advanced indexing)."""
    flat = rows.flatten()
    return (X.index_select(0, flat).view(*rows.shape, *X.shape[1:]), Y.index_select(0, flat).view(rows.shape))


def _twin(model, params: Params, x: torch.Tensor):
    """The model's stacked twin, checked against ``vmap`` on its first stacked batch (once per model: the verdict
    is kept), or None: the model has none, or a forward that mixes samples (see :mod:`fedblend.core.stacked`)."""
    if model not in TWINS:
        twin = stacked_twin(model)
        if twin is not None and not twin_agrees(model, twin, {n: v.detach() for n, v in params.items()}, x):
            warnings.warn(f"backend 'vmap': the stacked form of {type(model).__name__} disagrees with vmap on a "
                          f"batch (its forward mixes samples?); training it through vmap", RuntimeWarning, stacklevel=3)
            twin = None
        TWINS[model] = twin
    return TWINS[model]


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
    bs = cfg.batch_size if first.batch_size is None else first.batch_size
    opt = SGD(cfg.lr if first.lr is None else first.lr, cfg.momentum, cfg.weight_decay)
    names = list(first.params) if first.trainable is None else [n for n in first.params if n in set(first.trainable)]
    b = _batches(first, datas, gens, cfg, bs)
    order, idx, active, w, X, Y = b.order, b.idx, b.active, b.w, b.X, b.Y
    S, C = idx.shape[0], len(order)
    chunk = max(1, GATHER_BYTES // max(1, C * bs * X[:1].nbytes))
    stack = {n: torch.stack([specs[c].params[n].detach() for c in order]).clone() for n in first.params}
    kept = [[(specs[c].momentum or {}).get(n) if opt.momentum else None for c in order] for n in names]
    bufs = [torch.stack([torch.zeros_like(stack[n][0]) if k is None else k.to(stack[n]) for k in ks])
            for n, ks in zip(names, kept)] if opt.momentum else []
    term_args = [_tensor_args(t, [specs[c] for c in order], i) for i, t in enumerate(first.loss_terms)]
    term_scalars = [scalar_args(t) for t in first.loss_terms]
    xb, yb = _gather(X, Y, idx[:chunk]) if S else (None, None)
    twin = _twin(model, {n: v[: active[0]] for n, v in stack.items()}, xb[0, : active[0]]) if S else None
    native = twin is not None and not first.loss_terms  # terms see parameters in the model's layout
    if native:  # linear weights transposed: their gradients come out contiguous (a faster update)
        bufs = [b.transpose(1, 2).contiguous() if n in twin.native else b for n, b in zip(names, bufs)]
        stack = to_native(twin, stack)
    logits = vmap_logits(model) if twin is None else partial(twin_logits, twin, native=native)
    terms = [vmap(lambda p, ta, t=t, sc=sc: t.fn(p, None, **ta, **sc)) for t, sc in zip(first.loss_terms, term_scalars)]
    losses = torch.zeros((S, C), device=X.device)  # each client's mean batch loss at each step
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
    return _results(specs, b, names, stack, bufs, kept, losses, bool(opt.momentum))


@dataclass
class _Batches:
    """The batches of a batched SGD: every client's plan (:func:`~fedblend.core.training.batch_rows`, in client
    order), the clients ordered by their number of steps (longest first), and the rows of the concatenated data
    ``X``, ``Y`` (in that order) each step trains on."""

    plans: list
    order: list[int]
    idx: torch.Tensor  # [steps, clients, bs] rows of X / Y (padding: row 0, weight 0)
    active: list[int]  # clients still training at each step (a prefix of the order)
    counts: torch.Tensor  # [steps, clients]: each client's batch length at each step
    w: torch.Tensor  # each sample's weight in its client's mean loss
    X: torch.Tensor
    Y: torch.Tensor


def _batches(first: TrainSpec, datas: Sequence, gens: Sequence[torch.Generator], cfg: TrainConfig,
             bs: int) -> _Batches:
    """Every client draws its batches from its own stream as ``sgd_train`` does."""
    epochs = cfg.epochs if first.epochs is None else first.epochs
    xs = [getattr(d, f"{first.split}_x") for d in datas]
    ys = [getattr(d, f"{first.split}_y") for d in datas]
    plans = [batch_rows(len(y), bs, epochs, g, cfg.drop_last, first.steps, cfg.shuffle) for y, g in zip(ys, gens)]
    order = sorted(range(len(datas)), key=lambda c: -len(plans[c][1]))  # stable: equal lengths keep client order
    offsets = list(accumulate([len(ys[c]) for c in order], initial=0))
    idx = _stacked_rows([plans[c][0] for c in order], offsets, xs[0].device)
    active = (torch.tensor([len(plans[c][1]) for c in order]) > torch.arange(idx.shape[0])[:, None]).sum(1).tolist()
    real = idx >= 0
    counts = real.sum(-1)
    w = real / counts.clamp_min(1).unsqueeze(-1)
    X, Y = torch.cat([xs[c] for c in order]), torch.cat([ys[c] for c in order])
    return _Batches(plans, order, idx.clamp_min(0), active, counts, w, X, Y)


def _results(specs: Sequence[TrainSpec], b: _Batches, names: list[str], stack: Params, bufs: list,
             kept: list, losses: torch.Tensor, momentum: bool) -> list[TrainResult]:
    """Each client's :class:`TrainResult` (in client order) from the stacks of a batched SGD: its parameters, its
    momentum buffers (kept as they came where it took no step), its mean loss over the samples it saw."""
    steps = [len(b.plans[c][1]) for c in b.order]
    seen = [sum(b.plans[c][1]) for c in b.order]
    totals = (losses.double() * b.counts).sum(0).tolist()
    results: list[TrainResult | None] = [None] * len(b.order)
    for j, c in enumerate(b.order):
        spec = specs[c]
        params = {n: (stack[n][j] if n in names else spec.params[n].detach()) for n in spec.params}
        if not momentum:
            mom = None
        elif steps[j]:
            mom = {n: buf[j] for n, buf in zip(names, bufs)}
        else:
            mom = {n: kept[i][j].clone() for i, n in enumerate(names) if kept[i][j] is not None} or None
        results[c] = TrainResult(params, mom, totals[j] / seen[j] if seen[j] else float("nan"), steps[j], seen[j])
    return results  # type: ignore[return-value]
