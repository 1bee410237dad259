"""APPLE: the mixture (Eq. 2), one step of core and DR vector (Eq. 3-5) against autograd, the prior and its schedule,
what travels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.apple import apple_step, data_prior, mixture, prior_weight
from tests.helpers import run_client, same_state, tiny_sim, train_message

pytestmark = pytest.mark.usefixtures("one_thread")


def test_apple_mixture_prior_and_schedule_by_hand():
    cores = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 8.0]])}
    assert torch.allclose(mixture(torch.tensor([0.25, 0.75, 0.0]), cores)["w"], torch.tensor([2.5, 3.5]))
    assert torch.allclose(mixture(torch.tensor([0.5, 0.0, 0.5]), cores)["w"], torch.tensor([0.5, 5.0]))
    assert torch.allclose(data_prior(torch.tensor([0.0, 10.0, 30.0])),
                          torch.tensor([20.0, 10.0, 30.0], dtype=torch.float64) / 60)
    assert torch.allclose(data_prior(torch.zeros(4)), torch.full((4,), 0.25, dtype=torch.float64))
    assert prior_weight(0, 10, "cos") == 1.0 and prior_weight(5, 10, "cos") == pytest.approx(0.5)
    assert prior_weight(10, 10, "cos") == 0.0 and prior_weight(4, 10, "linear") == pytest.approx(0.6)


def _three_cores(tiny_fed, seed: int, own_row: int, client: int):
    """The model, three perturbed copies of the initial model stacked as cores, the own core (row ``own_row``) and a
    batch of 8 of ``client``'s training samples."""
    sim = tiny_sim(tiny_fed, "apple", rounds=1)
    g = torch.Generator().manual_seed(seed)
    cores = {k: torch.stack([v + 0.1 * torch.randn(v.shape, generator=g) for _ in range(3)])
             for k, v in sim.run_info.init_params.items()}
    data = tiny_fed.clients[client]
    return sim.model, cores, {k: v[own_row].clone() for k, v in cores.items()}, data.train_x[:8], data.train_y[:8]


def _mixture_grads(model, cores, dr, x, y):
    """dCE/dw of the mixture ``w = sum_j p_j c_j`` (per tensor) and its loss, by plain autograd."""
    w = {k: (dr.view(-1, *([1] * (v.dim() - 1))) * v).sum(0).requires_grad_(True) for k, v in cores.items()}
    ce = F.cross_entropy(functional_call(model, w, (x,)), y)
    return dict(zip(w, torch.autograd.grad(ce, list(w.values())))), ce


def test_apple_step_gradients_by_hand(tiny_fed):
    """Eq. 3-5: dL/dc_i = p_ii dCE/dw, dL/dp_j = <dCE/dw, c_j> + lambda mu (p_j - p0_j)."""
    model, cores, own, x, y = _three_cores(tiny_fed, seed=0, own_row=1, client=0)
    dr, prior = torch.tensor([0.2, 0.5, 0.3]), torch.tensor([0.3, 0.3, 0.4])
    new_own, new_dr, loss = apple_step(model, own, 1, cores, dr, prior, x, y, core_lr=0.5, dr_lr=0.1, lam_mu=0.2)
    gw, ce = _mixture_grads(model, cores, dr, x, y)
    assert loss == pytest.approx(float(ce.detach()), rel=1e-5)
    for k in own:
        assert torch.allclose(new_own[k], own[k] - 0.5 * dr[1] * gw[k], atol=1e-5), k
    gp = torch.tensor([sum(float((gw[k] * cores[k][j]).sum()) for k in gw) for j in range(3)])
    assert torch.allclose(new_dr, dr - 0.1 * (gp + 0.2 * (dr - prior)), atol=1e-5)


def test_apple_step_with_a_kept_buffer_equals_autograd_through_the_stacked_cores_bit_for_bit(tiny_fed):
    """The step's own mixture function (a float64 buffer of the received cores kept across steps, only the own row
    rewritten) gives exactly what autograd gives through re-stacking the cores each batch (its earlier form)."""
    from fedblend.algorithms.apple import stacked64

    sim = tiny_sim(tiny_fed, "apple", rounds=1)
    model, init = sim.model, sim.run_info.init_params
    g = torch.Generator().manual_seed(1)
    cores = {k: torch.stack([v + 0.1 * torch.randn(v.shape, generator=g) for _ in range(4)]) for k, v in init.items()}
    own = {k: v[2] + 0.05 for k, v in cores.items()}
    dr, prior = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.25, 0.25, 0.25, 0.25])
    data = tiny_fed.clients[0]
    buffer, a_own, a_dr, b_own, b_dr = stacked64(cores), own, dr, own, dr
    for lo in (0, 8, 16):  # three steps: the buffer is reused, its own row rewritten each time
        x, y = data.train_x[lo : lo + 8], data.train_y[lo : lo + 8]
        a_own, a_dr, a_loss = apple_step(model, a_own, 2, cores, a_dr, prior, x, y, 0.5, 0.1, 0.2, buffer)
        own_t = {k: v.detach().clone().requires_grad_(True) for k, v in b_own.items()}
        p = b_dr.detach().clone().requires_grad_(True)
        stacked = {k: torch.cat([cores[k][:2], own_t[k].unsqueeze(0), cores[k][3:]]) for k in own_t}
        whole = {k: (v.to(torch.float64) * p.to(torch.float64).view((-1,) + (1,) * (v.dim() - 1))).sum(0).to(v.dtype)
                 for k, v in stacked.items()}  # Eq. 2 as one tensor expression, autograd's gradients through it
        loss = F.cross_entropy(functional_call(model, whole, (x,)), y)
        grads = torch.autograd.grad(loss, list(own_t.values()) + [p])
        b_own = {k: (v - 0.5 * gr).detach() for (k, v), gr in zip(own_t.items(), grads[:-1])}
        b_dr = (p - 0.1 * (grads[-1] + 0.2 * (p - prior))).detach()
        assert a_loss == float(loss.detach())
        assert all(torch.equal(a_own[k], b_own[k]) for k in own) and torch.equal(a_dr, b_dr)


def test_apple_all_cores_down_own_core_up(tiny_fed):
    sim = tiny_sim(tiny_fed, "apple", rounds=3, seed=0)
    sim.run_round()
    msg = train_message(sim, 2)
    assert set(msg.arrays) == {"core_0", "core_1", "core_2", "core_3", "prior"}
    for j in range(4):
        assert all(torch.equal(msg.params(f"core_{j}")[n], sim.server["cores"][n][j]) for n in msg.params("core_0"))
    res = run_client(sim, 2, msg)
    assert set(res.reply.arrays) == {"params"} and same_state(res.reply.params(), res.state["core"])
    assert "dr" in res.state and "dr" not in res.reply.arrays  # the DR vector stays on the client
    model_bytes = sum(t.numel() * 4 for t in sim.run_info.init_params.values())
    assert sim.history[0]["bytes_down"][0] == 4 * model_bytes + 4 * 4 and sim.history[0]["bytes_up"][0] == model_bytes
    # the evaluated model is the client's mixture of the cores by its DR vector
    cores = {n: torch.stack([msg.params(f"core_{j}")[n] for j in range(4)]) for n in msg.params("core_0")}
    for n in cores:
        cores[n][2] = res.state["core"][n]
    assert same_state(mixture(res.state["dr"], cores), res.state["params"])


def test_apple_mean_dr_gradient_is_pflibs_mean_of_element_wise_means(tiny_fed):
    """``dr_grad = "mean"``: dL/dp_j = (1/T) sum_k mean(dCE/dw_k * c_j,k) over the T parameter tensors (PFLlib's
    clientapple.py), not Eq. 5's inner product; the core step is unchanged."""
    model, cores, own, x, y = _three_cores(tiny_fed, seed=2, own_row=0, client=1)
    dr, prior = torch.tensor([0.4, 0.5, 0.1]), torch.tensor([0.3, 0.3, 0.4])
    exact_own, exact_dr, _ = apple_step(model, own, 0, cores, dr, prior, x, y, 0.5, 0.1, 0.2)
    new_own, new_dr, _ = apple_step(model, own, 0, cores, dr, prior, x, y, 0.5, 0.1, 0.2, dr_grad="mean")
    gw, _ = _mixture_grads(model, cores, dr, x, y)
    gp = torch.tensor([sum(float((gw[k] * cores[k][j]).mean()) for k in gw) / len(gw) for j in range(3)])
    assert torch.allclose(new_dr, dr - 0.1 * (gp + 0.2 * (dr - prior)), atol=1e-6)
    assert not torch.allclose(new_dr, exact_dr, atol=1e-4)  # the two gradients really differ
    assert all(torch.equal(new_own[k], exact_own[k]) for k in own)


def test_apple_mixture_upload_sends_and_keeps_the_personalized_mixture(tiny_fed):
    """``upload = "mixture"`` (PFLlib's model_c): the reply is the client's evaluated mixture, which is its own core
    from then on; the paper's default uploads the trained core, which differs from the mixture."""
    for upload in ("core", "mixture"):
        sim = tiny_sim(tiny_fed, "apple", rounds=2, seed=0, options={"upload": upload})
        sim.run_round()
        res = run_client(sim, 1, train_message(sim, 1))
        assert same_state(res.reply.params(), res.state["core"])
        assert same_state(res.state["core"], res.state["params"]) is (upload == "mixture")


def test_apple_step_with_momentum_is_torch_sgd_over_the_own_core_and_the_dr_vector(tiny_fed):
    """``momentum`` (the APPLE authors' optimiser, ``train_APPLE.py``): three steps equal ``torch.optim.SGD`` with
    that momentum, a core and a DR learning rate, on the own core and the DR vector with the prior's pull
    ``lambda mu / 2 ||p - p0||^2`` in the loss; with momentum 0 the step is the plain one."""
    from fedblend.algorithms.apple import stacked64

    model, cores, own, _, _ = _three_cores(tiny_fed, seed=2, own_row=0, client=1)
    dr, prior, data = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.3, 0.3, 0.4]), tiny_fed.clients[1]
    own_t = {k: v.clone().requires_grad_(True) for k, v in own.items()}
    p = dr.clone().requires_grad_(True)
    opt = torch.optim.SGD([{"params": list(own_t.values())}, {"params": [p], "lr": 0.05}], lr=0.2, momentum=0.9)
    a_own, a_dr, velocity, buffer = own, dr, {}, stacked64(cores)
    for lo in (0, 8, 16):
        x, y = data.train_x[lo : lo + 8], data.train_y[lo : lo + 8]
        a_own, a_dr, _ = apple_step(model, a_own, 0, cores, a_dr, prior, x, y, 0.2, 0.05, 0.3, buffer,
                                    momentum=0.9, velocity=velocity)
        opt.zero_grad()
        stacked = {k: torch.cat([own_t[k].unsqueeze(0), cores[k][1:]]) for k in own_t}
        whole = {k: (v.to(torch.float64) * p.to(torch.float64).view((-1,) + (1,) * (v.dim() - 1))).sum(0).to(v.dtype)
                 for k, v in stacked.items()}  # Eq. 2 as one tensor expression, autograd's gradients through it
        loss = F.cross_entropy(functional_call(model, whole, (x,)), y) + 0.15 * ((p - prior) ** 2).sum()
        loss.backward()
        opt.step()
    for k in own:
        assert torch.allclose(a_own[k], own_t[k].detach(), atol=1e-6), k
    assert torch.allclose(a_dr, p.detach(), atol=1e-6) and not torch.allclose(a_dr, dr)
    plain = apple_step(model, own, 0, cores, dr, prior, x, y, 0.2, 0.05, 0.3)
    first = apple_step(model, own, 0, cores, dr, prior, x, y, 0.2, 0.05, 0.3, momentum=0.9, velocity={})
    assert all(torch.equal(plain[0][k], first[0][k]) for k in own) and torch.equal(plain[1], first[1])
