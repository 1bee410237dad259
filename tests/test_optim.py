"""The optimizers as data (``fedblend.core.optim``) equal ``torch.optim``'s updates."""

import math

import pytest
import torch

from fedblend.core.optim import SGD, SLICE, clip_grad_norm, global_norm, sgd_init, sgd_step


def test_sgd_step_equals_torch_sgd_with_momentum_and_decay():
    net = {"w": torch.tensor([1.0, -2.0]), "e": torch.tensor([0.5])}
    grads = [{"w": torch.tensor([0.3, 0.1]), "e": torch.tensor([1.0])},
             {"w": torch.tensor([-0.2, 0.4]), "e": torch.tensor([2.0])}]
    ours, opt = dict(net), sgd_init(net)
    for g in grads:
        ours, opt = sgd_step(ours, g, opt, 0.1, 0.9, 0.01, lrs={"e": 0.5}, decay={"e": False})
    w, e = torch.nn.Parameter(net["w"].clone()), torch.nn.Parameter(net["e"].clone())
    ref = torch.optim.SGD([{"params": [w]}, {"params": [e], "lr": 0.5, "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                          weight_decay=0.01)
    for g in grads:
        w.grad, e.grad = g["w"].clone(), g["e"].clone()
        ref.step()
    assert torch.allclose(ours["w"], w.detach()) and torch.allclose(ours["e"], e.detach())


def test_sgd_update_equals_torch_sgd_bit_for_bit_for_each_learner_of_a_stack():
    """:class:`SGD` on tensors stacked over three learners (the vmap backend's use) -- one starting with a kept
    momentum buffer, two fresh (a zero buffer) -- gives each learner exactly what ``torch.optim.SGD`` gives it
    alone, bit for bit (same fused kernels), over several steps with weight decay."""
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(3, 5, 4, generator=gen)
    grads = [torch.randn(3, 5, 4, generator=gen) for _ in range(4)]
    kept = torch.randn(5, 4, generator=gen)
    opt = SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    stack = p0.clone()
    bufs = [torch.stack([kept, torch.zeros(5, 4), torch.zeros(5, 4)])]
    for g in grads:
        opt.update_([stack], [g], bufs)
    for i in range(3):
        w = torch.nn.Parameter(p0[i].clone())
        ref = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False)
        if i == 0:
            ref.state[w]["momentum_buffer"] = kept.clone()
        for g in grads:
            w.grad = g[i].clone()
            ref.step()
        assert torch.equal(stack[i], w.detach()), i
        assert torch.equal(bufs[0][i], ref.state[w]["momentum_buffer"]), i


def test_sgd_without_momentum_keeps_no_buffers_and_steps_by_lr():
    opt = SGD(lr=0.5)
    p = torch.tensor([1.0, 2.0])
    assert opt.init([p]) == []
    opt.update_([p], [torch.tensor([1.0, -1.0])], [])
    assert torch.equal(p, torch.tensor([0.5, 2.5]))


def _unfused(p, g, buf, lr, mu, wd):
    """The update as plain tensor expressions, each product rounded before its sum (the recorded results' bits)."""
    d = g + wd * p if wd else g
    b = d if buf is None else mu * buf + d
    return p - lr * (b if mu else d), b


@pytest.mark.parametrize("mu,wd,first", [(0.9, 1e-3, False), (0.9, 1e-3, True), (0.9, 0.0, False), (0.0, 1e-3, False),
                                         (0.0, 0.0, True)])
@pytest.mark.parametrize("donate", [False, True])
def test_sgd_step_slices_give_the_unfused_update_bit_for_bit(mu, wd, first, donate):
    """The sliced update (tensors over several :data:`SLICE` slices, one not a multiple of it) equals the unfused
    expressions bit for bit, in every slice; ``net`` and ``opt`` are left as they were, and a donated gradient's
    memory holds the new parameters (an undonated one is untouched)."""
    gen = torch.Generator().manual_seed(0)
    net = {"big": torch.randn(2 * SLICE + 7, generator=gen), "m": torch.randn(5, 3, generator=gen),
           "none": torch.randn(0)}
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in net.items()}
    opt = sgd_init(net) if first else {"buf": {k: torch.randn(v.shape, generator=gen) for k, v in net.items()}, "t": 3}
    keep = ({k: v.clone() for k, v in net.items()}, {k: v.clone() for k, v in opt["buf"].items()},
            {k: v.clone() for k, v in grads.items()})
    new, nopt = sgd_step(net, grads, opt, 0.05, mu, wd, lrs={"m": 0.5}, donate=donate)
    for k in net:
        want_p, want_b = _unfused(keep[0][k], keep[2][k], None if first else keep[1][k], 0.5 if k == "m" else 0.05,
                                  mu, wd)
        assert torch.equal(new[k], want_p), k
        assert torch.equal(nopt["buf"][k], want_b if mu else keep[1][k]), k
        assert torch.equal(net[k], keep[0][k]) and torch.equal(opt["buf"][k], keep[1][k]), k
    assert (new["big"].data_ptr() == grads["big"].data_ptr()) == donate
    if not donate:
        assert all(torch.equal(grads[k], keep[2][k]) for k in grads)


def test_global_norm_is_the_float64_norm_of_all_tensors():
    gen = torch.Generator().manual_seed(1)
    ts = [torch.randn(3 * SLICE + 11, generator=gen) * 1e-2 + 3e-3, torch.randn(4, 5, generator=gen), torch.zeros(0)]
    want = math.sqrt(sum(float((t.double() ** 2).sum()) for t in ts))
    assert global_norm(ts) == pytest.approx(want, rel=1e-12)


def test_clip_grad_norm_scales_above_max_norm_only_and_reports_the_norm_after():
    """``torch.nn.utils.clip_grad_norm_``'s rule: below ``max_norm`` the gradients are returned as they are (the
    same tensors); above, scaled by ``max_norm / (norm + 1e-6)``; the norm returned is the norm after the clip."""
    grads = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}
    same, n = clip_grad_norm(grads, 10.0)
    assert n == pytest.approx(5.0) and all(same[k] is grads[k] for k in grads)
    clipped, n = clip_grad_norm(grads, 1.0)
    scale = 1.0 / (5.0 + 1e-6)
    assert torch.equal(clipped["a"], grads["a"] * scale) and torch.equal(clipped["b"], grads["b"] * scale)
    assert n == pytest.approx(1.0) and global_norm(list(clipped.values())) == pytest.approx(n, rel=1e-6)
