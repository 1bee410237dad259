"""The stacked twin (``fedblend.core.stacked``): every client's logits and gradients as ``vmap`` of the model gives
them, for every built-in image model; no twin where a layer has no stacked form; a model whose forward mixes
samples is caught by the check and trained through ``vmap``."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedblend.core.stacked import stacked_twin, twin_agrees, twin_logits, vmap_logits
from fedblend.models.zoo import FedModel, build_model


def _stacked(model, k, gen):
    return {n: torch.stack([v.detach() + 0.05 * torch.randn(v.shape, generator=gen) for _ in range(k)])
            for n, v in model.named_parameters()}


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("lenet5", (1, 28, 28)), ("cnn4", (3, 32, 32)),
                                        ("cnn5", (3, 32, 32))])
def test_stacked_twin_gives_vmaps_logits_and_gradients_per_client(name, shape):
    gen = torch.Generator().manual_seed(0)
    model = build_model(name, {"input_shape": shape, "in_channels": shape[0], "image_size": shape[1],
                               "num_classes": 10}, gen)
    twin = stacked_twin(model)
    assert twin is not None
    k, b = 3, 5
    x = torch.randn(k, b, *shape, generator=gen)
    y = torch.randint(0, 10, (k, b), generator=gen)
    grads = []
    for fn in (lambda p: twin_logits(twin, p, x), lambda p: vmap_logits(model)(p, x)):
        p = {n: v.requires_grad_(True) for n, v in _stacked(model, k, torch.Generator().manual_seed(1)).items()}
        out = fn(p)
        assert out.shape == (k, b, 10)
        loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
        grads.append((out.detach(), torch.autograd.grad(loss, list(p.values()))))
    (a, ga), (v, gv) = grads
    assert torch.allclose(a, v, rtol=1e-4, atol=1e-5)
    for g1, g2 in zip(ga, gv):
        assert torch.allclose(g1, g2, rtol=1e-4, atol=1e-6)
    # each client's logits are its own model's, not a neighbour's
    p = _stacked(model, k, torch.Generator().manual_seed(1))
    one = torch.func.functional_call(model, {n: t[1] for n, t in p.items()}, (x[1],))
    assert torch.allclose(twin_logits(twin, p, x)[1], one, rtol=1e-4, atol=1e-5)


class WithNorm(FedModel):
    layers = ("fc", "norm")
    head_layers = ("fc",)

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(64)
        self.fc = nn.Linear(64, 4)

    def features(self, x):
        return self.norm(x.flatten(1))

    def head(self, z):
        return self.fc(z)


class MixesSamples(FedModel):
    """Centres the batch without a module: wrong on a merged batch of several clients."""
    layers = ("fc",)
    head_layers = ("fc",)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def features(self, x):
        z = x.flatten(1)
        return z - z.mean(0, keepdim=True)

    def head(self, z):
        return self.fc(z)


def test_no_stacked_twin_for_a_layer_without_a_stacked_form():
    assert stacked_twin(WithNorm()) is None
    assert stacked_twin(nn.Sequential(nn.Flatten(), nn.Embedding(10, 4))) is None
    assert stacked_twin(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"))) is None


def test_a_forward_that_mixes_samples_fails_the_check_and_trains_through_vmap_as_sequential():
    from types import SimpleNamespace

    from fedblend.core.training import TrainConfig, TrainSpec, sgd_train
    from fedblend.core.vmap import batched_sgd

    model = MixesSamples()
    gen = torch.Generator().manual_seed(0)
    p = _stacked(model, 2, gen)
    x = torch.randn(2, 6, 1, 8, 8, generator=gen)
    assert not twin_agrees(model, stacked_twin(model), p, x)
    datas = [SimpleNamespace(train_x=torch.randn(12, 1, 8, 8, generator=gen), train_y=torch.randint(0, 4, (12,),
                                                                                                  generator=gen))
             for _ in range(2)]
    cfg = TrainConfig(lr=0.1, batch_size=4, epochs=1)
    specs = [TrainSpec({n: v[c] for n, v in p.items()}) for c in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = batched_sgd(model, specs, datas, [torch.Generator().manual_seed(c) for c in range(2)], cfg)
    assert any("disagrees with vmap" in str(w.message) for w in caught)
    for c in range(2):
        one = sgd_train(model, specs[c].params, datas[c].train_x, datas[c].train_y, cfg,
                        torch.Generator().manual_seed(c))
        for n, t in one.params.items():
            assert torch.allclose(res[c].params[n], t, atol=1e-6), (c, n)


@pytest.mark.parametrize("eval_bytes", [None, 1])
def test_evaluate_stacked_equals_each_client_evaluated_alone(eval_bytes, monkeypatch):
    """Clients of 1 to 23 samples (and one of none), each with its own model, in chunks of 4 samples, in one
    group or one client per group: counts exact, summed losses within float tolerance."""
    import fedblend.core.stacked as st
    from fedblend.core.evaluation import evaluate_params

    if eval_bytes is not None:
        monkeypatch.setattr(st, "EVAL_BYTES", eval_bytes)
    gen = torch.Generator().manual_seed(0)
    model = build_model("mlp", {"input_shape": (1, 8, 8), "num_classes": 4}, gen)
    p = _stacked(model, 5, gen)
    sizes = [7, 23, 1, 0, 12]
    items = [({n: v[c] for n, v in p.items()}, torch.randn(n, 1, 8, 8, generator=gen),
              torch.randint(0, 4, (n,), generator=gen)) for c, n in enumerate(sizes)]
    got = st.evaluate_stacked(vmap_logits(model), items, 4)
    twin = stacked_twin(model)
    got_twin = st.evaluate_stacked(lambda q, x: twin_logits(twin, q, x), items, 4)
    for (params, x, y), a, b in zip(items, got, got_twin):
        ref = evaluate_params(model, params, x, y, batch_size=4)
        for g in (a, b):
            assert g[0] == ref.correct and g[2] == ref.n == len(y)
            assert g[1] == pytest.approx(ref.loss, rel=1e-5, abs=1e-6)
