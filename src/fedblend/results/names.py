"""Display names: methods by their classes' ``display_name`` (one registry: the methods' own classes,
plug-ins included), datasets and models by their papers' spelling, and the setting text figures are titled with
(``"FMNIST, Dir(0.1), 20 clients, LeNet-5"``). Pure functions over resolved configs (``summary.json``'s
``run.config``, or ``config.toml``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedblend.algorithms import registry
from fedblend.common import plugins

DATASET_NAMES = {"mnist": "MNIST", "fmnist": "FMNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
                 "ag_news": "AG News", "usps": "USPS", "mnist_star": "MNIST*", "synthetic": "synthetic",
                 "synthetic-64k": "synthetic (64k)"}
MODEL_NAMES = {"cnn4": "4-layer CNN", "lenet5": "LeNet-5", "cnn5": "5-layer CNN", "mlp": "MLP", "fasttext": "fastText"}


def method_name(spec: str) -> str:
    """The display name of a method spec, each part's :func:`display_name`: ``"fedprox+ala"`` ->
    ``"FedProx+ALA"``; a plug-in ``"pkg.mod:MyMethod"`` -> its class's ``display_name``, else ``"MyMethod"``."""
    return "+".join(display_name(p) for p in spec.split("+"))


def display_name(name: str) -> str:
    """The display name of one registered method or transform: the ``display_name`` its class sets (the papers'
    spelling, ``FedALA``; a plug-in sets its own; a subclass that sets none does not show its base's), else
    :func:`default_display_name` (also when the plug-in that made an old run is not installed here: a figure's
    legend is no reason to fail)."""
    cls = registry.METHODS.get(name) or registry.TRANSFORMS.get(name)
    if cls is None:  # a plug-in: a "pkg.mod:Class" path or an installed entry point
        for kind in ("method", "transform"):
            try:
                cls = registry.find_plugin(kind, name)
            except plugins.PluginError:
                cls = None
            if cls is not None:
                break
    own = vars(cls).get("display_name") if cls is not None else None  # a subclass is another method: not inherited
    return own or default_display_name(name)


def default_display_name(name: str) -> str:
    """A name for a class that sets no ``display_name``: the registry name, or a plug-in path's class name
    (``"pkg.mod:MyMethod"`` -> ``"MyMethod"``)."""
    return name.rsplit(":", 1)[-1]


def setting_text(cfg: dict[str, Any], model: bool = True) -> str:
    """``"FMNIST, Dir(0.1), 20 clients, LeNet-5"``: dataset, partition, clients (and join ratio), model."""
    part = cfg.get("partition") or {}
    kind = part.get("kind", "?")
    if kind == "dirichlet":
        how = f"Dir({part.get('alpha'):g})"
    elif kind == "pathological":
        how = f"{part.get('classes_per_client')} classes/client"
    elif kind == "shards":
        how = f"{part.get('shards_per_client')} shards/client"
    else:
        how = {"iid": "IID", "one_class": "one class/client", "domains": "by domain", "indices": "imported split",
               "flwr": f"flwr {part.get('flwr', '')}".strip()}.get(kind, kind)
    clients = f"{part.get('num_clients', '?')} clients"
    samp = cfg.get("sampling") or {}
    if samp.get("scheme", "fixed") == "fixed" and samp.get("join_ratio", 1.0) < 1.0:
        clients += f" ({samp['join_ratio']:g} join)"
    elif samp.get("scheme") == "uniform_range":
        clients += f" ({samp.get('low'):g}-{samp.get('high'):g} join)"
    bits = [DATASET_NAMES.get(cfg.get("dataset", "?"), cfg.get("dataset", "?")), how, clients]
    if model:
        bits.append(MODEL_NAMES.get(cfg.get("model", "?"), cfg.get("model", "?")))
    return ", ".join(bits)


def common_setting(configs: Sequence[dict]) -> str | None:
    """The setting text every config shares, or None when they differ."""
    texts = {setting_text(c) for c in configs if c}
    return texts.pop() if len(texts) == 1 else None
