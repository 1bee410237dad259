"""Models used by the four papers, each with ordered layers and a body/head split.

Every model is an ``nn.Module`` with attributes named after its layers, so a parameter's layer is its name's
prefix (``fc1.weight`` -> ``fc1``), plus:

* ``layers``: layer names from input to output (ALA's ``p`` and FedALP's per-layer weights count these);
* ``head_layers``: the layers kept private by methods that share only the body (FedAPA, FedRep, pFedRLLA);
* ``features(x)`` (the body's output, the representation FedProto / FedPAC / DBE work on) and ``head(z)``
  (the head layers); ``forward(x) = head(features(x))``, and ``forward(x, part="features" | "head")`` reaches
  either half through ``torch.func.functional_call``.

Architectures (sizes as in ``shared/notes/reference-implementations.md``):

* ``cnn4``   FedALA / PFLlib "FedAvgCNN": conv(in,32,5)-ReLU-pool2, conv(32,64,5)-ReLU-pool2, fc1(dim,512)-ReLU,
  fc(512,C); dim 1024 for 28x28, 1600 for 32x32 (582,026 parameters on MNIST). FedALA paper, Sec. Experiments.
* ``lenet5`` FedAPA Sec. 5.1: conv(in,6,5)-ReLU-pool2, conv(6,16,5)-ReLU-pool2, fc1(d,120)-ReLU, fc2(120,84)-ReLU,
  fc3(84,C); d 256 for 28x28, 400 for 32x32. Body = first four layers, head = fc3.
* ``mlp``    FedALP's MNIST-NN: 784-50-10 with ReLU (Fraboni et al. 2021).
* ``cnn5``   FedALP's MNIST-CNN. The paper gives no layers; we define 3 conv + 2 fc layers:
  conv(in,32,3,p1)-ReLU-pool2, conv(32,64,3,p1)-ReLU-pool2, conv(64,64,3,p1)-ReLU-pool2, fc1(64*3*3,128)-ReLU,
  fc2(128,C) for 28x28 inputs.
* ``fasttext`` FedALA's text model (PFLlib fastText): embedding(V,32) averaged over non-padding tokens,
  fc1(32,32), fc(32,C), no activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedblend.common import plugins
from fedblend.common.errors import ConfigError
from fedblend.common.guard import plugin_guard
from fedblend.common.params import Params, layer_of


class FedModel(nn.Module):
    """Base class: ordered ``layers`` and ``head_layers`` (the private decision part)."""

    layers: tuple[str, ...] = ()
    head_layers: tuple[str, ...] = ()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def head(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, part: str = "logits") -> torch.Tensor:
        """``"logits"``: ``head(features(x))``; ``"features"``: the body's output; ``"head"``: ``x`` is a feature."""
        if part == "logits":
            return self.head(self.features(x))
        if part == "features":
            return self.features(x)
        if part == "head":
            return self.head(x)
        raise ValueError(f"part must be 'logits', 'features' or 'head', got {part!r}")

    def param_names(self, layers: Sequence[str] | None = None) -> list[str]:
        """Parameter names, in order, of the given layers (all layers when None)."""
        wanted = set(self.layers if layers is None else layers)
        unknown = wanted - set(self.layers)
        if unknown:
            raise ValueError(f"unknown layers {sorted(unknown)}; this model has {list(self.layers)}")
        return [n for n, _ in self.named_parameters() if layer_of(n) in wanted]

    def head_names(self) -> list[str]:
        return self.param_names(self.head_layers)

    def body_names(self) -> list[str]:
        return self.param_names([ly for ly in self.layers if ly not in self.head_layers])

    def top_layers(self, p: int) -> tuple[str, ...]:
        """The ``p`` layers closest to the output (FedALA's "range of ALA")."""
        if not 1 <= p <= len(self.layers):
            raise ValueError(f"p must be in [1, {len(self.layers)}] for this model, got {p}")
        return self.layers[-p:]


def _conv_out(size: int, k: int, pad: int = 0) -> int:
    return size + 2 * pad - k + 1


class CNN4(FedModel):
    layers = ("conv1", "conv2", "fc1", "fc")
    head_layers = ("fc",)

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        s = _conv_out(_conv_out(image_size, 5) // 2, 5) // 2
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * s * s, 512)
        self.fc = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z)


class LeNet5(FedModel):
    layers = ("conv1", "conv2", "fc1", "fc2", "fc3")
    head_layers = ("fc3",)

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        s = _conv_out(_conv_out(image_size, 5) // 2, 5) // 2
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return F.relu(self.fc2(x))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc3(z)


class MLP(FedModel):
    layers = ("fc1", "fc2")
    head_layers = ("fc2",)

    def __init__(self, in_features: int, num_classes: int, hidden: int = 50):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc2(z)


class CNN5(FedModel):
    layers = ("conv1", "conv2", "conv3", "fc1", "fc2")
    head_layers = ("fc2",)

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        s = image_size // 2 // 2 // 2
        self.conv1 = nn.Conv2d(in_channels, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * s * s, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        for conv in (self.conv1, self.conv2, self.conv3):
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc2(z)


class FastText(FedModel):
    layers = ("embedding", "fc1", "fc")
    head_layers = ("fc",)

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 32):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x != 0).unsqueeze(-1).to(self.embedding.weight.dtype)
        emb = (self.embedding(x) * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return self.fc1(emb)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z)


def _image(cls: type) -> Callable[[dict], FedModel]:
    def make(info: dict) -> FedModel:
        if "image_size" not in info:
            raise ValueError(f"model {cls.__name__} needs an image dataset, got input {info}")
        return cls(info["in_channels"], info["num_classes"], info["image_size"])

    return make


MODELS: dict[str, Callable[[dict], FedModel]] = {
    "cnn4": _image(CNN4),
    "lenet5": _image(LeNet5),
    "cnn5": _image(CNN5),
    "mlp": lambda info: MLP(int(math.prod(info["input_shape"])), info["num_classes"]),
    "fasttext": lambda info: FastText(info["vocab_size"], info["num_classes"]),
}


def init_params(model: nn.Module, generator: torch.Generator) -> None:
    """Re-initialise ``model`` in place from ``generator`` with PyTorch's default rules.

    Linear / conv weights: Kaiming-uniform with a = sqrt(5); biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in));
    embeddings: N(0, 1) with the padding row zeroed. Using a generator keeps library code off the global seed.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
                if module.bias is not None:
                    fan_in = module.weight[0].numel()
                    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                    nn.init.uniform_(module.bias, -bound, bound, generator=generator)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, generator=generator)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()


def build_model(name: str, info: dict, generator: torch.Generator | None = None) -> FedModel:
    """Build model ``name`` for a dataset described by ``info`` (see ``FederatedData.info``)."""
    if find_model(name) is None:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}, a plug-in's entry point (group "
                         f"fedblend.models) or 'package.module:Class'")
    with torch.random.fork_rng(devices=[]), plugin_guard(MODELS[name], "model", "__init__", name=name):
        model = MODELS[name](info)  # (module constructors draw from the global RNG: keep it untouched)
    if not isinstance(model, FedModel):
        raise plugins.PluginError(f"model plug-in {name!r} built a {type(model).__name__}, not a "
                                  f"fedblend.models.zoo.FedModel (layers, head_layers, features(), head())")
    if generator is not None:
        init_params(model, generator)
    return model


def load_initial_weights(model: nn.Module, path: str) -> None:
    """Copy the weights saved at ``path`` (a ``state_dict`` written by ``torch.save``, tensors only) into ``model``
    in place of its seeded draw (the config's ``init``). Every parameter and buffer must be there, with the
    model's shape; an extra or missing name, or a shape that differs, is a ``ConfigError`` naming them."""
    if not Path(path).is_file():
        raise ConfigError(f"init: {path} is not a file (a state_dict saved with torch.save)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt or non-torch file: one line, not pickle's traceback
        raise ConfigError(f"init: {path} is not a readable torch file ({type(exc).__name__}: {exc})") from None
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor) for v in saved.values()):
        raise ConfigError(f"init: {path} must hold a state_dict (a dict of tensor names to tensors)")
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        raise ConfigError(f"init: {path} does not fit the model: missing {missing or 'nothing'}, "
                         f"unexpected {extra or 'nothing'} (the model's names: {sorted(own)})")
    bad = [f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}" for k, v in own.items() if saved[k].shape != v.shape]
    if bad:
        raise ConfigError(f"init: {path} has tensors of other shapes than the model's: {', '.join(bad)}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(saved[k].to(v.dtype))


def initial_model(name: str, info: dict, generator: torch.Generator, init: str = "") -> FedModel:
    """The run's initial model: ``name`` drawn from ``generator`` (the seed tree's ``model-init`` stream), or,
    with ``init`` set, the weights of that file (:func:`load_initial_weights`)."""
    model = build_model(name, info, generator)
    if init:
        load_initial_weights(model, init)
    return model


def find_model(name: str) -> Callable[[dict], FedModel] | None:
    """The builder of model ``name``: built in, or a plug-in (``fedblend.common.plugins``: an entry point of
    ``fedblend.models`` or ``"package.module:Class"``), a callable ``(info) -> FedModel`` (a ``FedModel`` subclass
    taking the dataset's ``info`` dict is one) registered under ``name``. None if there is no such model."""
    if name in MODELS:
        return MODELS[name]
    obj = plugins.find("model", name)
    if obj is None:
        return None
    MODELS[name] = plugins.check_callable("model", name, obj, "a callable (info) -> FedModel")
    return MODELS[name]


def model_params(model: nn.Module) -> Params:
    """Detached copy of the model's parameters, in declaration order."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}
