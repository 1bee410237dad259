"""The optimizers as data (``fedblend.core.optim``) equal ``torch.optim``'s updates."""

import torch

from fedblend.core.optim import SGD, sgd_init, sgd_step


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
