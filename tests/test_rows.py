"""The server's weighted row sums (``fedblend.algorithms.parts.rows``): sliced, they equal the whole-tensor float64
expressions they replace bit for bit (one thread), forward and gradient, across slice boundaries and tails."""

import pytest
import torch

from fedblend.algorithms.parts.rows import COLS, aggregate_row, column_slices, row_dots, sq_distances, stack_flat, weighted_sum
from fedblend.testing import one_thread

# shapes with no slicing, exactly one and two slices, remainders of 1 and of COLS - 1, and real layer shapes
SHAPES = [(7,), (COLS,), (2 * COLS,), (2 * COLS + 1,), (3 * COLS - 1,), (64, 32, 5, 5), (512, 1024), (10, 513)]


def _whole(row, t):
    """The expression :func:`weighted_sum` replaces (FedAPA Eq. 5 as first written)."""
    shape = (-1,) + (1,) * (t.dim() - 1)
    return (t.to(torch.float64) * row.to(torch.float64).view(shape)).sum(0).to(t.dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 17, 50])
def test_weighted_sum_equals_the_whole_tensor_expression_bit_for_bit(shape, m):
    gen = torch.Generator().manual_seed(m)
    with one_thread():
        for dtype in (torch.float32, torch.float64):
            t = torch.randn(m, *shape, generator=gen, dtype=dtype)
            row = torch.rand(m, generator=gen, dtype=dtype)
            out = weighted_sum(row, t)
            assert out.dtype == dtype and out.shape == t.shape[1:]
            assert torch.equal(out, _whole(row, t))
        assert weighted_sum(row, t, torch.float32).dtype == torch.float32


@pytest.mark.parametrize("shape", SHAPES)
def test_row_dots_equal_the_whole_tensor_reduction_bit_for_bit(shape):
    gen = torch.Generator().manual_seed(3)
    with one_thread():
        g = torch.randn(*shape, generator=gen, dtype=torch.float64)
        for dtype in (torch.float64, torch.float32):
            t = torch.randn(50, *shape, generator=gen, dtype=dtype)
            t64 = t.to(torch.float64)
            whole = (g.unsqueeze(0).expand_as(t64) * t64).sum(tuple(range(1, t64.dim())), keepdim=True).view(-1)
            assert torch.equal(row_dots(g, t), whole)


@pytest.mark.parametrize("shape", [(2 * COLS + 5,), (64, 32, 5, 5)])
def test_aggregate_row_gradients_equal_autograd_through_the_whole_tensor_expression(shape):
    gen = torch.Generator().manual_seed(4)
    with one_thread():
        t = torch.randn(20, *shape, generator=gen)
        cot = torch.randn(*shape, generator=gen)
        grads = []
        for fn in (lambda r, x: aggregate_row(r, {"w": x})["w"], _whole):
            row = torch.rand(20, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
            x = t.clone().requires_grad_(True)
            out = fn(row, x)
            grads.append(torch.autograd.grad((out * cot).sum(), [row, x]) + (out.detach(),))
        (gr_a, gt_a, out_a), (gr_b, gt_b, out_b) = grads
        assert torch.equal(out_a, out_b) and torch.equal(gr_a, gr_b) and torch.equal(gt_a, gt_b)


@pytest.mark.parametrize("n", [1, COLS - 1, COLS, COLS + 1, 2 * COLS - 1, 2 * COLS, 5 * COLS + 3])
def test_column_slices_cover_the_range_in_order_none_narrower_than_cols(n):
    bounds = list(column_slices(n))
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    widths = [b - a for a, b in bounds]
    assert all(w == COLS for w in widths[:-1])
    assert widths[-1] == n if n < 2 * COLS else COLS <= widths[-1] < 2 * COLS


def test_off_the_cpu_branch_is_the_whole_tensor_expression(monkeypatch):
    """Off the CPU (a GPU) the weighted sum and the row gradient are the whole-tensor expressions themselves; run
    here on the CPU by switching the slicing off, they give the same bits as the sliced path."""
    from fedblend.algorithms.parts import rows

    gen = torch.Generator().manual_seed(6)
    with one_thread():
        t = torch.randn(17, 2 * COLS + 3, generator=gen)
        row = torch.rand(17, generator=gen)
        g = torch.randn(2 * COLS + 3, generator=gen, dtype=torch.float64)
        sliced = (weighted_sum(row, t), row_dots(g, t))
        monkeypatch.setattr(rows, "_sliced", lambda _t: False)
        whole = (weighted_sum(row, t), row_dots(g, t))
    assert torch.equal(whole[0], _whole(row, t)) and torch.equal(whole[0], sliced[0])
    assert torch.equal(whole[1], sliced[1])


@pytest.mark.parametrize("m,i", [(1, 0), (5, 0), (50, 17)])
def test_sq_distances_equal_the_stacked_flat_expression_bit_for_bit(m, i, monkeypatch):
    """FedAMP's distances row by row equal ``((F - F[i]) ** 2).sum(1)`` over the stacked flat models, on the CPU
    and in the off-the-CPU branch."""
    from fedblend.algorithms.parts import rows

    gen = torch.Generator().manual_seed(m)
    thetas = {"conv": torch.randn(m, 64, 32, 5, 5, generator=gen), "fc": torch.randn(m, 2 * COLS + 7, generator=gen),
              "bias": torch.randn(m, 10, generator=gen, dtype=torch.float64)}
    with one_thread():
        flat = stack_flat(thetas)
        whole = ((flat - flat[i]) ** 2).sum(1)
        assert torch.equal(sq_distances(thetas, i), whole) and float(whole[i]) == 0.0
        monkeypatch.setattr(rows, "_sliced", lambda _t: False)
        assert torch.equal(sq_distances(thetas, i), whole)
