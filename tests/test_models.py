import pytest
import torch

from fedblend.common.params import num_params
from fedblend.models import build_model, model_params

IMG28 = {"in_channels": 1, "num_classes": 10, "image_size": 28, "input_shape": (1, 28, 28)}
IMG32 = {"in_channels": 3, "num_classes": 10, "image_size": 32, "input_shape": (3, 32, 32)}


@pytest.mark.parametrize("name,info,n_params,layers,head", [
    ("cnn4", IMG28, 582_026, ("conv1", "conv2", "fc1", "fc"), ("fc",)),
    ("cnn4", IMG32, 32 * 75 + 32 + 51_264 + 1600 * 512 + 512 + 5130, ("conv1", "conv2", "fc1", "fc"), ("fc",)),
    ("lenet5", IMG28, 156 + 2416 + 256 * 120 + 120 + 120 * 84 + 84 + 850, ("conv1", "conv2", "fc1", "fc2", "fc3"), ("fc3",)),
    ("lenet5", IMG32, 456 + 2416 + 400 * 120 + 120 + 10164 + 850, ("conv1", "conv2", "fc1", "fc2", "fc3"), ("fc3",)),
    ("mlp", IMG28, 784 * 50 + 50 + 510, ("fc1", "fc2"), ("fc2",)),
    ("cnn5", IMG28, 320 + 18_496 + 36_928 + 576 * 128 + 128 + 1290, ("conv1", "conv2", "conv3", "fc1", "fc2"), ("fc2",)),
])
def test_shapes_and_layer_metadata(name, info, n_params, layers, head):
    m = build_model(name, info, torch.Generator().manual_seed(0))
    x = torch.randn(3, *info["input_shape"])
    assert m(x).shape == (3, 10)
    assert num_params(model_params(m)) == n_params
    assert m.layers == layers and m.head_layers == head
    # every parameter belongs to a declared layer, in order, and body + head cover them exactly once
    names = [n for n, _ in m.named_parameters()]
    assert sorted(m.body_names() + m.head_names()) == sorted(names)
    assert [n.rsplit(".", 1)[0] for n in names] == sorted({n.rsplit(".", 1)[0] for n in names}, key=layers.index) \
        or all(n.rsplit(".", 1)[0] in layers for n in names)
    assert m.param_names(m.top_layers(1)) == m.head_names()


def test_fasttext():
    m = build_model("fasttext", {"vocab_size": 50, "num_classes": 4}, torch.Generator().manual_seed(0))
    x = torch.tensor([[3, 4, 0, 0], [5, 0, 0, 0]])
    assert m(x).shape == (2, 4)
    # padding does not change the mean embedding
    assert torch.allclose(m(torch.tensor([[5, 0]])), m(torch.tensor([[5, 0, 0, 0, 0]])))


def test_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = model_params(build_model("lenet5", IMG28, torch.Generator().manual_seed(7)))
    after = torch.rand(1)
    b = model_params(build_model("lenet5", IMG28, torch.Generator().manual_seed(7)))
    assert torch.equal(before, after)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_top_layers_bounds():
    m = build_model("lenet5", IMG28)
    assert m.top_layers(2) == ("fc2", "fc3")
    with pytest.raises(ValueError, match="p must be in"):
        m.top_layers(6)


def test_unknown_model():
    with pytest.raises(ValueError, match="choose one of"):
        build_model("resnet", IMG28)
