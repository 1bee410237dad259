"""The optimizers as data (``fedblend.core.optim``) equal ``torch.optim``'s updates."""

import torch

from fedblend.core.optim import sgd_direction, sgd_init, sgd_step


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


def test_sgd_direction_masks_fresh_buffers_per_learner():
    """A stack of learners, the first with a fresh buffer: its direction is the gradient, the other's the
    heavy-ball sum (the vmap backend's per-client rule)."""
    g, p, buf = torch.tensor([[1.0], [1.0]]), torch.tensor([[2.0], [2.0]]), torch.tensor([[10.0], [10.0]])
    d = sgd_direction(g, p, buf, 0.5, 0.1, torch.tensor([[True], [False]]))
    assert torch.allclose(d, torch.tensor([[1.2], [6.2]]))
