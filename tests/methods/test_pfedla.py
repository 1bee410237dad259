"""pFedLA: the layer weights, the layer-wise aggregate and the hypernetwork step."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.pfedla import PFedLAOptions, groups, layer_weights, layerwise_aggregate
from fedblend.algorithms.pfedla import init_hypernet as la_init

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pfedla_layerwise_aggregation_with_given_alphas():
    """theta-bar^l = sum_j alpha^{l,j} theta_j^l: weight and bias of a layer share the layer's weights."""
    thetas = {"a.weight": torch.tensor([[[1.0, 2.0]], [[3.0, 6.0]]]), "a.bias": torch.tensor([[1.0], [5.0]]),
              "b.weight": torch.tensor([[[2.0]], [[4.0]]])}
    grouping = groups(list(thetas), "layer")
    assert grouping == [["a.weight", "a.bias"], ["b.weight"]]
    alpha = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    out = layerwise_aggregate(alpha, thetas, grouping)
    assert torch.allclose(out["a.weight"], torch.tensor([[2.5, 5.0]]))  # 0.25*[1,2] + 0.75*[3,6]
    assert torch.allclose(out["a.bias"], torch.tensor([4.0]))  # 0.25*1 + 0.75*5
    assert torch.allclose(out["b.weight"], torch.tensor([[2.0]]))
    assert groups(list(thetas), "tensor") == [["a.weight"], ["a.bias"], ["b.weight"]]


def test_pfedla_hypernetwork_gradient_is_the_chain_rule_and_descends():
    from fedblend.algorithms.parts.hypernet import proxy_cotangent, vjp

    g = torch.Generator().manual_seed(3)
    thetas = {"a.weight": torch.randn(3, 2, 2, generator=g), "b.bias": torch.randn(3, 4, generator=g)}
    grouping = groups(list(thetas), "layer")
    net = la_init(len(grouping), 3, PFedLAOptions(embed_dim=4, hidden=5), g)

    def build(n):
        return layerwise_aggregate(layer_weights(n, 1, len(grouping)), thetas, grouping)

    with torch.no_grad():
        bar = build(net)
    alpha = layer_weights(net, 1, len(grouping))
    assert torch.allclose(alpha.sum(1), torch.ones(len(grouping))) and bool((alpha >= 0).all())
    trained = {k: v + 0.5 for k, v in bar.items()}
    grads = vjp(net, build, proxy_cotangent(bar, trained, "descent"))
    leaves = {k: v.clone().requires_grad_(True) for k, v in net.items()}
    out = build(leaves)
    loss = 0.5 * sum(((out[k] - trained[k]) ** 2).sum() for k in out)
    want = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    for (k, v), w in zip(net.items(), want):
        assert torch.allclose(grads[k], torch.zeros_like(v) if w is None else w, atol=1e-5), k
    literal = vjp(net, build, proxy_cotangent(bar, trained, "literal"))
    assert all(torch.allclose(literal[k], -grads[k]) for k in grads)



def test_pfedla_eval_scores_the_stored_trained_model_or_the_aggregate(tiny_fed):
    """``[eval] model = "trained"`` (default, FL-bench): the evaluation message is the client's stored theta_i (its last
    upload); ``"received"``: the aggregate theta-bar_i the training message carries. Training is the same."""
    from fedblend.core.evaluation import EvalProtocol
    from tests.helpers import eval_message, same_state, tiny_sim, train_message

    sims = {}
    for ev in ("trained", "received"):
        sim = tiny_sim(tiny_fed, "pfedla", rounds=3, seed=0, protocol=EvalProtocol(model=ev))
        sim.run_round()
        sim.run_round()
        sims[ev] = sim
        stored = {n: t[1] for n, t in sim.server["thetas"].items()}
        scored = eval_message(sim, 1).params()
        assert same_state(scored, stored) is (ev == "trained")
        assert same_state(scored, train_message(sim, 1).params()) is (ev == "received")
    trained, received = sims["trained"], sims["received"]
    assert [m["train_loss"] for m in trained.history] == [m["train_loss"] for m in received.history]
    assert [m["acc"] for m in trained.history] != [m["acc"] for m in received.history]
    assert "after its last local training" in trained.method.traits.eval_model
    assert "builds now" in received.method.traits.eval_model
