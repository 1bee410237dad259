"""Per-client tables on the server: every client's parameters stacked on a leading client axis
(``{name: (M, *shape)}``; built with :func:`fedblend.common.params.stack_copies`, updated with
:func:`~fedblend.common.params.with_rows`), and models built from a row of weights over them (FedAPA Eq. 5,
FedAMP's cloud models u_i, APPLE's mixture Eq. 2, pFedLA's layer-wise aggregates).

The weighted sum ``sum_j a_j theta_j`` and its gradient with respect to the row run slice by slice
(:func:`weighted_sum`, :func:`row_dots`) instead of forming the ``(M, *shape)`` float64 product at once: for 50
clients of a 0.5 M-parameter layer that product is 200 MB, freshly allocated (one page fault per 4 KiB) on every
call, and the allocation, not the arithmetic, set APPLE's step time. Each output element is summed by the same
kernel path, in the same order, as the whole-tensor expression, so results are equal bit for bit (tested, one
thread; with several threads torch splits the whole-tensor reduction itself, by the thread count)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from fedblend.common.params import Params

#: Columns per slice of :func:`weighted_sum`: a multiple of every SIMD block torch's outer-dimension sum walks
#: the columns in, so a column sits at the same place in its block as in the whole tensor (the last slice takes
#: the remainder, so no slice is narrower than ``COLS``); 50 x 4096 float64 products fit a core's L2 cache.
COLS = 4096


def stack_flat(thetas: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``{name: (M, *shape)}`` -> ``(M, P)`` float64 matrix whose row ``j`` is client ``j``'s flat theta_j."""
    return torch.cat([t.reshape(t.shape[0], -1).to(torch.float64) for t in thetas.values()], dim=1)


def _sliced(t: torch.Tensor) -> bool:
    """Whether :func:`weighted_sum` / :func:`row_dots` go slice by slice: on the CPU."""
    return t.device.type == "cpu"


def column_slices(n: int, cols: int = COLS) -> Iterator[tuple[int, int]]:
    """``[a, b)`` bounds covering ``range(n)``: ``cols`` wide, the last one ``cols`` to ``2 cols - 1`` wide (the
    whole range when ``n < 2 cols``)."""
    k = max(1, n // cols)
    for i in range(k):
        yield i * cols, (i + 1) * cols if i < k - 1 else n


def weighted_sum(row: torch.Tensor, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``sum_j row_j t_j`` over the leading axis of ``t``, in float64, rounded to ``dtype`` (default ``t``'s):
    bit for bit ``(t.to(float64) * row.view(-1, 1, ...)).sum(0).to(dtype)``, slice by slice (module docstring).
    No autograd (:func:`aggregate_row` carries the gradient). Off the CPU, the whole-tensor expression itself (a
    GPU's caching allocator reuses the memory, and a kernel launch per slice would cost more than it saves)."""
    m = t.shape[0]
    flat = t.detach().reshape(m, -1)
    r = row.detach().to(torch.float64).view(m, 1)
    if not _sliced(t):
        return (flat.to(torch.float64) * r).sum(0).to(dtype or t.dtype).view(t.shape[1:])
    out = torch.empty(flat.shape[1], dtype=dtype or t.dtype, device=t.device)
    for a, b in column_slices(flat.shape[1]):
        out[a:b] = (flat[:, a:b].to(torch.float64) * r).sum(0)
    return out.view(t.shape[1:])


def row_dots(g: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``<g, t_j>`` in float64 for every row ``j`` of ``t`` (``g`` in float64): bit for bit
    ``(g.unsqueeze(0) * t.to(float64)).sum(dims 1..)``, the gradient of :func:`weighted_sum` with respect to the
    row, one row at a time (each row converted on its own; off the CPU, the whole-tensor expression)."""
    if not _sliced(t):
        return (g.unsqueeze(0) * t.to(torch.float64)).sum(tuple(range(1, t.dim())))
    return torch.stack([(g * t[j].to(torch.float64)).sum() for j in range(t.shape[0])])


def sq_distances(thetas: Mapping[str, torch.Tensor], i: int) -> torch.Tensor:
    """``||theta_j - theta_i||^2`` in float64 for every row ``j`` (all tensors flattened, in order): bit for bit
    ``((F - F[i]) ** 2).sum(1)`` with ``F = stack_flat(thetas)``, one flat row at a time on the CPU (FedAMP's
    attention, Eq. 7, for 50 clients of cnn4 would otherwise copy 230 MB per client)."""
    if not _sliced(next(iter(thetas.values()))):
        flat = stack_flat(thetas)
        return ((flat - flat[i]) ** 2).sum(1)

    def flat_row(j: int) -> torch.Tensor:
        return torch.cat([t[j].reshape(-1).to(torch.float64) for t in thetas.values()])

    own = flat_row(i)
    m = next(iter(thetas.values())).shape[0]
    return torch.stack([((flat_row(j) - own) ** 2).sum() for j in range(m)])


class _WeightedSum(torch.autograd.Function):
    """:func:`weighted_sum` with autograd's gradients of the whole-tensor expression (pFedLA differentiates its
    aggregate with respect to the row): the row's through :func:`row_dots`, the stacked tensor's element-wise."""

    @staticmethod
    def forward(ctx, row: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(row, t)
        return weighted_sum(row, t)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        row, t = ctx.saved_tensors
        g = grad_out.to(torch.float64)
        grad_row = grad_t = None
        if ctx.needs_input_grad[0]:
            grad_row = row_dots(g, t.detach()).to(row.dtype)
        if ctx.needs_input_grad[1]:
            shape = (-1,) + (1,) * (t.dim() - 1)
            grad_t = (g.unsqueeze(0) * row.detach().to(torch.float64).view(shape)).to(t.dtype)
        return grad_row, grad_t


def aggregate_row(row: torch.Tensor, thetas: Mapping[str, torch.Tensor]) -> Params:
    """``theta_bar_i = sum_j a_ij theta_j`` for every stacked tensor (computed in float64, FedAPA Eq. 5)."""
    if torch.is_grad_enabled() and (row.requires_grad or any(t.requires_grad for t in thetas.values())):
        return {name: _WeightedSum.apply(row, t) for name, t in thetas.items()}
    return {name: weighted_sum(row, t) for name, t in thetas.items()}
