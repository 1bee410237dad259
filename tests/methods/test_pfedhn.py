"""pFedHN: generation, the hypernetwork's gradient by the vector-Jacobian product, pFedHN-PC's own head."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.pfedhn import PFedHNOptions, generate, hypernet_grads, init_hypernet
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.optim import sgd_init, sgd_step
from tests.helpers import run_client, same_state, tiny_sim, train_message, without_timings

pytestmark = pytest.mark.usefixtures("one_thread")


def _targets():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(3, 2, generator=g), "a.bias": torch.randn(3, generator=g)}


def test_pfedhn_update_direction_is_the_vjp_with_the_returned_delta():
    """Alg. 1 lines 8-10: grad = (d theta_i / d phi)^T (theta_i - theta~_i), against autograd of <theta(phi), delta>."""
    targets = _targets()
    shapes = {k: v.shape for k, v in targets.items()}
    net = init_hypernet(targets, 5, PFedHNOptions(hidden=7, n_hidden=2), torch.Generator().manual_seed(1))
    with torch.no_grad():
        gen = generate(net, 2, shapes)
    trained = {k: v + 0.3 * torch.randn_like(v) for k, v in gen.items()}
    got = hypernet_grads(net, 2, shapes, trained)
    leaves = {k: v.clone().requires_grad_(True) for k, v in net.items()}
    out = generate(leaves, 2, shapes)
    inner = sum((out[k] * (gen[k] - trained[k])).sum() for k in out)
    want = dict(zip(leaves, torch.autograd.grad(inner, list(leaves.values()), allow_unused=True)))
    for k in net:
        w = torch.zeros_like(net[k]) if want[k] is None else want[k]
        assert torch.allclose(got[k], w, atol=1e-6), k
    assert got["embed"][0].abs().sum() == 0 and got["embed"][2].abs().sum() > 0  # only v_i of the client moves
    # a small step against it brings the generated model towards the trained one
    step, _ = sgd_step(net, got, sgd_init(net), 1e-3)
    with torch.no_grad():
        after = generate(step, 2, shapes)
    dist = lambda p: sum(float(((p[k] - trained[k]) ** 2).sum()) for k in p)  # noqa: E731
    assert dist(after) < dist(gen)


def test_pfedhn_pc_keeps_the_head_on_the_client(tiny_fed):
    sim = tiny_sim(tiny_fed, "pfedhn", {"personal_head": True}, rounds=2)
    sim.run()
    head = set(sim.model.head_names())
    msg = train_message(sim, 0)
    assert not head & set(msg.params()) and set(msg.params()) == set(sim.model.body_names())
    reply = run_client(sim, 0, msg).reply
    assert not head & set(reply.params())
    full = tiny_sim(tiny_fed, "pfedhn", rounds=1)
    assert set(train_message(full, 0).params()) == set(full.run_info.init_params)


def test_pfedhn_eval_trained_scores_the_last_trained_model(tiny_fed):
    """``[eval] model = "trained"``: the client's model after its last local training is scored; training is unchanged."""
    rec = tiny_sim(tiny_fed, "pfedhn", rounds=2, seed=3)
    tr = tiny_sim(tiny_fed, "pfedhn", rounds=2, seed=3, protocol=EvalProtocol(model="trained"))
    assert tr.method.traits.keeps_model and not tr.method.traits.evaluates_received_model
    ha, hb = without_timings(rec.run()), without_timings(tr.run())
    assert [m["train_loss"] for m in ha] == [m["train_loss"] for m in hb]
    assert same_state(rec.server, tr.server)  # the hypernetwork moved the same
    assert [m["acc"] for m in ha] != [m["acc"] for m in hb]  # a different model is scored


def test_pfedhn_embed_decay_decays_every_embedding_row():
    """Authors' code / FL-bench: weight decay on the embeddings too (rows of clients not trained shrink)."""
    targets = _targets()
    net = init_hypernet(targets, 5, PFedHNOptions(hidden=7, n_hidden=1), torch.Generator().manual_seed(1))
    zero = {k: torch.zeros_like(v) for k, v in net.items()}
    on, _ = sgd_step(net, zero, sgd_init(net), 0.1, 0.9, 0.5, decay={"embed": True})
    off, _ = sgd_step(net, zero, sgd_init(net), 0.1, 0.9, 0.5, decay={"embed": False})
    assert torch.allclose(on["embed"], net["embed"] * (1 - 0.05)) and torch.equal(off["embed"], net["embed"])


def test_pfedhn_grad_norm_records_the_gradient_applied_after_the_clip(tiny_fed):
    """``pfedhn_grad_norm`` is the 2-norm of the hypernetwork gradient the step applies: ``grad_clip`` where the
    clip acts, the unclipped norm (above it) where the clip is off."""
    clipped = without_timings(tiny_sim(tiny_fed, "pfedhn", {"grad_clip": 1e-4}, rounds=2).run())
    free = without_timings(tiny_sim(tiny_fed, "pfedhn", {"grad_clip": 0.0}, rounds=2).run())
    assert all(r["pfedhn_grad_norm"] == pytest.approx(1e-4, rel=1e-5) for r in clipped)
    assert all(r["pfedhn_grad_norm"] > 1e-3 for r in free)
